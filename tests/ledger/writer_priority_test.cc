// The ledger writer's priority (server/ledger/tenant_ledger.h): idle
// (SCHED_IDLE) while it keeps up, a normal thread at nice 10 while a backlog
// (two batches, or two delays' worth) or a Flush waits, idle again once it
// has caught up; niced only when it could not leave idle priority again or
// writer_idle is off. Every event is committed whatever the priority.
//
// Bazel's sandbox takes CAP_SYS_NICE away (and RLIMIT_NICE is 0 on these
// machines), so this test runs outside it (tags = ["no-sandbox"]); where it
// still may not lower a nice value, it checks the fallback and skips.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "server/ledger/tenant_ledger.h"
#include "server/ledger/usage_account.h"
#include "tests/ledger/ledger_test_events.h"

namespace gpumem {
namespace ledger {
namespace {

constexpr int64_t kSec = 1'000'000'000;

// The writer thread's id (its name is gpumemd-ledger); 0 if there is none.
pid_t WriterTid() {
  DIR* d = opendir("/proc/self/task");
  pid_t found = 0;
  while (dirent* e = d ? readdir(d) : nullptr) {
    std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string name;
    if (std::getline(comm, name) && name == "gpumemd-ledger") found = atoi(e->d_name);
  }
  if (d) closedir(d);
  return found;
}

// Polls `f` for up to 5 s.
template <typename F>
bool Eventually(F f) {
  for (int i = 0; i < 500; ++i) {
    if (f()) return true;
    usleep(10000);
  }
  return f();
}

TEST(TenantLedgerTest, WriterIsIdlePriorityUntilABacklogOrAWaitRaisesIt) {
  const std::string path = TempDir() + "/ledger.db";
  LedgerOptions o;
  o.path = path;
  o.max_delay = absl::Milliseconds(50);
  auto l = TenantLedger::Open(o);
  ASSERT_TRUE(l.ok());
  pid_t tid = 0;
  ASSERT_TRUE(Eventually([&] { return (tid = WriterTid()) != 0; }));
  // Whether it may leave idle priority again decides whether it goes idle
  // at all: RLIMIT_NICE of 10 or more (for nice 10), or CAP_SYS_NICE (this
  // thread may lower its own nice value).
  rlimit limit{};
  getrlimit(RLIMIT_NICE, &limit);
  bool capable = limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= 10;
  const pid_t self = static_cast<pid_t>(syscall(SYS_gettid));
  const int nice = getpriority(PRIO_PROCESS, self);
  if (!capable && setpriority(PRIO_PROCESS, self, nice - 1) == 0) {
    capable = true;
    setpriority(PRIO_PROCESS, self, nice);
  }
  // The thread has its name before its start-up has set its priority (and
  // checked CAP_SYS_NICE by lowering its nice by one for a moment): a
  // commit comes after that start-up, idle priority at its end.
  if (!capable) {
    (*l)->Append(Alloc(1000000, 0, 0, 0));
    ASSERT_TRUE((*l)->Flush().ok());
    EXPECT_EQ(sched_getscheduler(tid), SCHED_OTHER);
    EXPECT_EQ(getpriority(PRIO_PROCESS, tid), 10);
    GTEST_SKIP() << "this process may not leave SCHED_IDLE: the writer stays at nice 10";
  }
  ASSERT_TRUE(Eventually([&] { return sched_getscheduler(tid) == SCHED_IDLE; }));
  EXPECT_EQ(getpriority(PRIO_PROCESS, tid), 10);

  // An event two delays older than the one queued before it: the next
  // Append raises the writer (it may have taken the first already; then
  // the pair is tried again).
  uint64_t id = 1, bytes = 0;
  ASSERT_TRUE(Eventually([&] {
    (*l)->Append(Alloc(id++, 0, 10, absl::GetCurrentTimeNanos() - 10 * kSec));
    (*l)->Append(Alloc(id++, 0, 10, 0));
    bytes += 20;
    return (*l)->stats().writer_promotions >= 1;
  }));
  // Raised, it commits and, caught up, goes back to idle priority.
  ASSERT_TRUE((*l)->Flush().ok());
  EXPECT_TRUE(Eventually([&] { return sched_getscheduler(tid) == SCHED_IDLE; }));
  EXPECT_TRUE((*l)->stats().writer_idle);
  EXPECT_EQ(getpriority(PRIO_PROCESS, tid), 10);

  // Every core busy with normal threads: the idle writer gets (almost) no
  // core, so two batches queue up before it takes them, and it is raised.
  const uint64_t before = (*l)->stats().writer_promotions;
  std::atomic<bool> spin{true};
  std::vector<std::thread> spinners;
  for (unsigned i = 0; i < std::max(2u, std::thread::hardware_concurrency()); ++i) {
    spinners.emplace_back([&] {
      while (spin.load(std::memory_order_relaxed)) {
      }
    });
  }
  usleep(20000);  // the spinners are running
  for (size_t i = 0; i < 4 * o.max_batch; ++i) (*l)->Append(Alloc(id++, 1, 1, 0));
  bytes += 4 * o.max_batch;
  const uint64_t after = (*l)->stats().writer_promotions;
  spin = false;
  for (std::thread& t : spinners) t.join();
  EXPECT_GT(after, before);
  ASSERT_TRUE((*l)->Flush().ok());
  EXPECT_TRUE(Eventually([&] { return sched_getscheduler(tid) == SCHED_IDLE; }));
  // Every event counted, whatever the writer's priority when it took it.
  EXPECT_EQ((*l)->Usage().at({"ml", UsageAccount::kAllDevices}).current_bytes, bytes);
  EXPECT_EQ((*l)->stats().committed_events, id - 1);
}

TEST(TenantLedgerTest, WriterStaysNicedWhenIdlePriorityIsOff) {
  const std::string path = TempDir() + "/ledger.db";
  LedgerOptions o;
  o.path = path;
  o.writer_idle = false;
  auto l = TenantLedger::Open(o);
  ASSERT_TRUE(l.ok());
  pid_t tid = 0;
  ASSERT_TRUE(Eventually([&] { return (tid = WriterTid()) != 0; }));
  // A commit comes after the writer's start-up, whose check of CAP_SYS_NICE
  // lowers its nice by one for a moment: look only once one is done.
  (*l)->Append(Alloc(1, 0, 10, 0));
  ASSERT_TRUE((*l)->Flush().ok());
  EXPECT_EQ(sched_getscheduler(tid), SCHED_OTHER);
  EXPECT_EQ(getpriority(PRIO_PROCESS, tid), 10);
  EXPECT_FALSE((*l)->stats().writer_idle);
}

}  // namespace
}  // namespace ledger
}  // namespace gpumem
