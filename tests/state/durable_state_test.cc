// DurableState (server/state/durable_state.h): records survive the process
// that wrote them, a SIGKILL at any instant leaves every record wholly there
// or absent, updates leave the newest copy, and a file that is not ours, is
// from another boot or is locked by another daemon is handled as documented;
// disk space is allocated before it is used (a full disk answers "state
// table full", never SIGBUS), and the file is 0600 whatever the umask.
#include "server/state/durable_state.h"

#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace gpumem {
namespace state {
namespace {

std::string TempPath() {
  char dir[] = "/tmp/gpumemd-state-XXXXXX";
  EXPECT_NE(mkdtemp(dir), nullptr);
  return std::string(dir) + "/state";
}

// Every field a function of the id, so a torn record cannot pass.
AllocationRecordData Alloc(uint64_t id) {
  AllocationRecordData r;
  r.id = id;
  r.session = id * 3 + 1;
  r.slab_id = id % 97;
  r.offset = id * 4096;
  r.size = (id % 31 + 1) * 256;
  r.charged = r.size - id % 7;
  r.time_ns = static_cast<int64_t>(id) * 1000;
  r.uid = static_cast<uint32_t>(id % 1000);
  r.pid = static_cast<int32_t>(id % 30000);
  r.tenant = static_cast<uint32_t>(id % 5);
  r.device = static_cast<uint32_t>(id % 4);
  return r;
}

bool Consistent(const AllocationRecordData& r) {
  AllocationRecordData want = Alloc(r.id);
  want.slot = r.slot;
  return std::memcmp(&want, &r, sizeof(r)) == 0;
}

TEST(DurableStateTest, RecordsOutliveTheWriterAndFreedOnesDoNot) {
  const std::string path = TempPath();
  Snapshot previous;
  std::string note;
  {
    auto s = DurableState::Open(path, &previous, &note);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_TRUE(previous.empty());
    EXPECT_TRUE(absl::StrContains(note, "new state file")) << note;
    SlabRecord slab;
    slab.slab_id = 7;
    slab.size = 1 << 30;
    slab.handle_ino = 1234;
    slab.set_tenant_name("ml");
    (*s)->PutSlab(slab);
    SessionRecord sess;
    sess.id = 3;
    sess.pid = 4242;
    sess.start_ticks = 99;
    sess.set_token("00112233445566778899aabbccddeeff");
    (*s)->PutSession(sess);
    uint32_t a = (*s)->PutAllocation(Alloc(10));
    (*s)->PutAllocation(Alloc(11));
    (*s)->RemoveAllocation(a);
    HolderRecord h;
    h.slab_id = 7;
    h.session = 3;
    (*s)->PutHolder(h);
  }
  auto s = DurableState::Open(path, &previous, &note);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(absl::StrContains(note, "previous daemon")) << note;
  ASSERT_EQ(previous.slabs.size(), 1u);
  EXPECT_EQ(previous.slabs[0].slab_id, 7u);
  EXPECT_EQ(previous.slabs[0].handle_ino, 1234u);
  EXPECT_EQ(previous.slabs[0].tenant_name_string(), "ml");
  ASSERT_EQ(previous.sessions.size(), 1u);
  EXPECT_EQ(previous.sessions[0].token_string(), "00112233445566778899aabbccddeeff");
  ASSERT_EQ(previous.allocations.size(), 1u);
  EXPECT_EQ(previous.allocations[0].id, 11u);
  EXPECT_TRUE(Consistent(previous.allocations[0]));
  ASSERT_EQ(previous.holders.size(), 1u);
  // A second daemon on the same file is refused while the first holds it.
  Snapshot other;
  auto second = DurableState::Open(path, &other, &note);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(second.status().message(), "another gpumemd"));
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}

TEST(DurableStateTest, AnUpdateLeavesTheNewestCopy) {
  const std::string path = TempPath();
  Snapshot previous;
  std::string note;
  {
    auto s = DurableState::Open(path, &previous, &note);
    ASSERT_TRUE(s.ok());
    SlabRecord slab;
    slab.slab_id = 5;
    slab.retained = 0;
    (*s)->PutSlab(slab);
    slab.retained = 1;  // the update: a new copy published, the old one left (a crash between)
    (*s)->PutSlab(slab);
  }
  auto s = DurableState::Open(path, &previous, &note);
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(previous.slabs.size(), 1u);
  EXPECT_EQ(previous.slabs[0].retained, 1);
  EXPECT_EQ(previous.superseded, 1u);
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}

TEST(DurableStateTest, AFileOfAnotherFormatOrBootIsStartedOver) {
  const std::string path = TempPath();
  std::ofstream(path) << "not a state file at all, but long enough to have a header? no";
  Snapshot previous;
  std::string note;
  {
    auto s = DurableState::Open(path, &previous, &note);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_TRUE(previous.empty());
    EXPECT_TRUE(absl::StrContains(note, "started over")) << note;
    (*s)->PutAllocation(Alloc(1));
  }
  // Another boot: the boot id in the header no longer matches.
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(16);  // magic (8), format (4), header size (4), then the boot id
    f.write("ffffffff", 8);
  }
  auto s = DurableState::Open(path, &previous, &note);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(previous.empty());
  EXPECT_TRUE(absl::StrContains(note, "reboot")) << note;
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}

// A writer is SIGKILLed at random instants while it puts, updates and
// removes records from two threads: after each kill every record found is
// whole, none is found twice, every record the writer had reported
// published (and not begun to remove) is there, and removed ones are gone
// (all but at most the one per thread whose removal the kill interrupted).
TEST(DurableStateTest, KillAtAnyInstantLeavesWholeRecords) {
  const std::string path = TempPath();
  std::mt19937_64 rng(42);
  uint64_t next_id = 1;
  for (int round = 0; round < 40; ++round) {
    int pipe_fds[2];
    ASSERT_EQ(pipe(pipe_fds), 0);
    const uint64_t first = next_id;
    next_id += 1000000;
    const pid_t child = fork();
    if (child == 0) {
      close(pipe_fds[0]);
      Snapshot previous;
      std::string note;
      auto s = DurableState::Open(path, &previous, &note);
      if (!s.ok()) _exit(2);
      // Start from nothing so the parent's bookkeeping is this round's.
      (*s)->Clear();
      const uint64_t go = 1;
      if (write(pipe_fds[1], &go, sizeof(go)) != sizeof(go)) _exit(3);
      std::vector<std::thread> threads;
      for (int t = 0; t < 2; ++t) {
        threads.emplace_back([&, t] {
          std::vector<std::pair<uint64_t, uint32_t>> mine;
          for (uint64_t i = first + t; ; i += 2) {
            const uint32_t slot = (*s)->PutAllocation(Alloc(i));
            mine.emplace_back(i, slot);
            if (i % 3 == 0 && mine.size() > 4) {
              auto [id, old] = mine[mine.size() / 2];
              // Said before it happens: the parent then takes either answer.
              const uint64_t removing = id | (uint64_t{1} << 63);
              if (write(pipe_fds[1], &removing, sizeof(removing)) != sizeof(removing)) _exit(4);
              (*s)->RemoveAllocation(old);
              mine.erase(mine.begin() + mine.size() / 2);
            }
            if (write(pipe_fds[1], &i, sizeof(i)) != sizeof(i)) _exit(4);
          }
        });
      }
      for (auto& th : threads) th.join();
      _exit(0);
    }
    close(pipe_fds[1]);
    uint64_t go = 0;
    ASSERT_EQ(read(pipe_fds[0], &go, sizeof(go)), static_cast<ssize_t>(sizeof(go)));
    std::this_thread::sleep_for(std::chrono::microseconds(200 + rng() % 20000));
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    std::set<uint64_t> published, removed;
    uint64_t v;
    while (read(pipe_fds[0], &v, sizeof(v)) == static_cast<ssize_t>(sizeof(v))) {
      if (v >> 63) {
        removed.insert(v & ~(uint64_t{1} << 63));
      } else {
        published.insert(v);
      }
    }
    close(pipe_fds[0]);
    Snapshot previous;
    std::string note;
    auto s = DurableState::Open(path, &previous, &note);
    ASSERT_TRUE(s.ok()) << s.status();
    std::set<uint64_t> found;
    for (const AllocationRecordData& r : previous.allocations) {
      ASSERT_TRUE(Consistent(r)) << "torn record " << r.id << " in round " << round;
      ASSERT_TRUE(found.insert(r.id).second) << "record " << r.id << " twice";
    }
    EXPECT_EQ(previous.damaged, 0u);
    for (uint64_t id : published) {
      if (removed.count(id) == 0) {
        EXPECT_TRUE(found.count(id) == 1) << "published record " << id << " lost, round " << round;
      }
    }
    // A record whose removal began may be there or not; one whose removal
    // was followed by further work must be gone.
    int gone = 0;
    for (uint64_t id : removed) gone += found.count(id) == 0;
    EXPECT_GE(gone + 2, static_cast<int>(removed.size())) << "removed records came back";
  }
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}

// The disk fills (the allocator seam answers ENOSPC past the first chunk):
// the record that needs the next chunk is refused "state table full" by
// name, every record kept before stays, a freed slot is reused, and once
// space comes back the table grows again.
TEST(DurableStateTest, AFullDiskAnswersTableFullAndKeepsWhatItHas) {
  const std::string path = TempPath();
  Snapshot previous;
  std::string note;
  auto full = std::make_shared<std::atomic<bool>>(false);
  auto calls = std::make_shared<std::atomic<int>>(0);
  Allocator seam = [full, calls](int fd, uint64_t offset, uint64_t bytes) {
    ++*calls;
    if (full->load()) return ENOSPC;
    return posix_fallocate(fd, static_cast<off_t>(offset), static_cast<off_t>(bytes));
  };
  auto s = DurableState::Open(path, &previous, &note, std::move(seam));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(calls->load(), 5);  // the header and each table's first chunk
  const uint64_t start_bytes = (*s)->allocated_bytes();
  full->store(true);
  std::vector<uint32_t> slots;
  absl::Status refused;
  for (uint64_t id = 1; id < 100000; ++id) {
    absl::StatusOr<uint32_t> slot = (*s)->AddAllocation(Alloc(id));
    if (!slot.ok()) {
      refused = slot.status();
      break;
    }
    slots.push_back(*slot);
  }
  ASSERT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "state table full")) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), path)) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "allocations")) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), absl::StrCat(slots.size(), " records")))
      << refused;
  EXPECT_EQ(slots.size(), kChunkBytes / ((24 + sizeof(AllocationRecordData) + 7) / 8 * 8));
  EXPECT_EQ((*s)->PutAllocation(Alloc(999999)), kNoSlot);  // the Put form: not kept
  EXPECT_EQ((*s)->allocated_bytes(), start_bytes);
  // A freed slot needs no new space.
  (*s)->RemoveAllocation(slots.back());
  absl::StatusOr<uint32_t> reused = (*s)->AddAllocation(Alloc(slots.size()));
  ASSERT_TRUE(reused.ok()) << reused.status();
  EXPECT_EQ(*reused, slots.back());
  full->store(false);
  absl::StatusOr<uint32_t> grown = (*s)->AddAllocation(Alloc(200000));
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_EQ(*grown, slots.size());
  EXPECT_GT((*s)->allocated_bytes(), start_bytes);
  Snapshot now = (*s)->Load();
  EXPECT_EQ(now.allocations.size(), slots.size() + 1);
  for (const AllocationRecordData& r : now.allocations) EXPECT_TRUE(Consistent(r)) << r.id;
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}

TEST(DurableStateTest, AStartThatCannotAllocateFailsNamingTheFileAndTheBytes) {
  const std::string path = TempPath();
  Snapshot previous;
  std::string note;
  auto s = DurableState::Open(path, &previous, &note,
                              [](int, uint64_t offset, uint64_t) { return offset == 0 ? 0 : ENOSPC; });
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted) << s.status();
  EXPECT_TRUE(absl::StrContains(s.status().message(), path)) << s.status();
  EXPECT_TRUE(absl::StrContains(s.status().message(), "cannot allocate")) << s.status();
  EXPECT_TRUE(absl::StrContains(s.status().message(), " bytes")) << s.status();
  EXPECT_TRUE(absl::StrContains(s.status().message(), "No space left")) << s.status();
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}

// A real small tmpfs, in a child with its own mount namespace: 1 MiB is too
// small to start (an error naming the file, no SIGBUS); on 6 MiB the table
// fills to "state table full" and the child lives on. Skipped where the
// sandbox refuses to mount (the seam test above covers the same path).
TEST(DurableStateTest, ARealFullTmpfsNeverKillsTheProcess) {
  char dir[] = "/tmp/gpumemd-tmpfs-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  if (child == 0) {
    close(pipe_fds[0]);
    auto say = [&](const std::string& line) {
      const std::string l = line + "\n";
      (void)!write(pipe_fds[1], l.data(), l.size());
    };
    if (unshare(CLONE_NEWNS) != 0 || mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        mount("tmpfs", dir, "tmpfs", 0, "size=1m") != 0) {
      say(absl::StrCat("skip: cannot mount a tmpfs here: ", strerror(errno)));
      _exit(77);
    }
    Snapshot previous;
    std::string note;
    const std::string path = std::string(dir) + "/state";
    auto small = DurableState::Open(path, &previous, &note);
    say(absl::StrCat("small: ", small.ok() ? "opened" : std::string(small.status().message())));
    small = absl::UnknownError("closed");
    if (umount(dir) != 0 || mount("tmpfs", dir, "tmpfs", 0, "size=6m") != 0) _exit(3);
    auto s = DurableState::Open(path, &previous, &note);
    if (!s.ok()) {
      say(absl::StrCat("6m: ", s.status().message()));
      _exit(4);
    }
    uint64_t kept = 0;
    for (uint64_t id = 1; id < 1000000; ++id) {
      absl::StatusOr<uint32_t> slot = (*s)->AddAllocation(Alloc(id));
      if (!slot.ok()) {
        say(absl::StrCat("full after ", kept, ": ", slot.status().message()));
        break;
      }
      ++kept;
    }
    say(absl::StrCat("loaded ", (*s)->Load().allocations.size()));
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string out;
  char buf[512];
  ssize_t n;
  while ((n = read(pipe_fds[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  rmdir(dir);
  ASSERT_TRUE(WIFEXITED(status)) << "child killed by signal " << WTERMSIG(status) << "\n" << out;
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << out;
  ASSERT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "small: state " + std::string(dir) + "/state: cannot allocate"))
      << out;
  EXPECT_TRUE(absl::StrContains(out, "state table full: table allocations")) << out;
  EXPECT_TRUE(absl::StrContains(out, "loaded ")) << out;
  std::cout << out;
}

TEST(DurableStateTest, TheFileIs0600WhateverTheUmaskAndAWiderOneIsTightened) {
  const std::string path = TempPath();
  const mode_t old = umask(0);
  Snapshot previous;
  std::string note;
  {
    auto s = DurableState::Open(path, &previous, &note);
    ASSERT_TRUE(s.ok()) << s.status();
  }
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  {
    auto s = DurableState::Open(path, &previous, &note);
    ASSERT_TRUE(s.ok()) << s.status();
  }
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  umask(old);
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}

}  // namespace
}  // namespace state
}  // namespace gpumem
