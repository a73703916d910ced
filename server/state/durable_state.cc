// See durable_state.h. The file: a 4 KiB header, then one table after
// another, each an array of fixed-size slots:
//   slot = [state word][version][checksum][payload]
// state: 0 free, kLive published. A table's high-water mark (in the header)
// bounds the slots ever used, so Load scans no further. Free slots are
// found again at Open by that scan, and kept in memory.
// Disk space: a table's slots below `allocated` (in memory, a whole number
// of chunks, at least the high-water mark) have their pages allocated; the
// mark never passes `allocated`, so every slot ever written, read by Load or
// cleared is on allocated pages.
#include "server/state/durable_state.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <type_traits>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/strings/strip.h"

namespace gpumem {
namespace state {
namespace {

constexpr uint64_t kMagic = 0x5441545350554d47ull;  // "GMUPSTAT"
// 2: SessionRecord::via_socket; 3: AllocationRecordData::request_key.
constexpr uint32_t kFormat = 3;
constexpr uint64_t kLive = 0x4c495645;  // "LIVE"
constexpr size_t kHeaderBytes = 4096;
constexpr size_t kSlotHead = 24;  // state, version, checksum

enum TableId { kSlabs, kAllocations, kSessions, kHolders, kTables };

template <typename T>
constexpr size_t SlotBytes() {
  return (kSlotHead + sizeof(T) + 7) / 8 * 8;
}

struct TableShape {
  const char* name;
  size_t slot_bytes;
  uint64_t capacity;
};
// A slot costs memory only once its chunk is allocated (kChunkBytes).
const TableShape kShapes[kTables] = {
    {"slabs", SlotBytes<SlabRecord>(), uint64_t{1} << 16},
    {"allocations", SlotBytes<AllocationRecordData>(), uint64_t{1} << 23},
    {"sessions", SlotBytes<SessionRecord>(), uint64_t{1} << 18},
    {"holders", SlotBytes<HolderRecord>(), uint64_t{1} << 20},
};

struct Header {
  uint64_t magic;
  uint32_t format;
  uint32_t header_bytes;
  char boot_id[40];
  uint64_t table_offset[kTables];
  uint64_t slot_bytes[kTables];
  uint64_t capacity[kTables];
  std::atomic<uint64_t> high_water[kTables];
  // When a record was last published or removed (Unix ns): a daemon that
  // died did nothing after this.
  std::atomic<int64_t> last_change_ns;
};
static_assert(sizeof(Header) <= kHeaderBytes, "header too big");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "need lock-free 64-bit atomics");

struct SlotHead {
  std::atomic<uint64_t> state;
  uint64_t version;
  uint64_t checksum;
};

uint64_t Checksum(uint64_t version, const void* payload, size_t size) {
  uint64_t h = 0xcbf29ce484222325ull ^ version;
  const unsigned char* p = static_cast<const unsigned char*>(payload);
  for (size_t i = 0; i < size; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string BootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return std::string(absl::StripAsciiWhitespace(id));
}

bool NoSpace(int error) { return error == ENOSPC || error == EDQUOT || error == EFBIG; }

int Fallocate(int fd, uint64_t offset, uint64_t bytes) {
  return posix_fallocate(fd, static_cast<off_t>(offset), static_cast<off_t>(bytes));
}

size_t FileBytes() {
  size_t bytes = kHeaderBytes;
  for (const TableShape& t : kShapes) bytes += t.slot_bytes * t.capacity;
  return bytes;
}

}  // namespace

struct DurableState::Table {
  char* base = nullptr;  // slot 0
  uint64_t offset = 0;   // of slot 0 in the file
  size_t slot_bytes = 0;
  uint64_t capacity = 0;
  std::atomic<uint64_t>* high_water = nullptr;
  const char* name = "";
  absl::Mutex mu;
  std::vector<uint32_t> free ABSL_GUARDED_BY(mu);
  bool warned_full ABSL_GUARDED_BY(mu) = false;
  // Slots whose pages have disk space (see the file comment).
  std::atomic<uint64_t> allocated{0};

  uint64_t chunk_slots() const { return std::max<uint64_t>(1, kChunkBytes / slot_bytes); }

  SlotHead* head(uint32_t slot) const {
    return reinterpret_cast<SlotHead*>(base + slot * slot_bytes);
  }
  char* payload(uint32_t slot) const { return base + slot * slot_bytes + kSlotHead; }
};

namespace {

// Every record of one table that is wholly there, newest copy of each key;
// older copies and damaged slots are freed.
template <typename T>
std::vector<T> LoadTable(DurableState::Table& t, uint64_t* damaged, uint64_t* superseded,
                         bool free_garbage) {
  absl::flat_hash_map<uint64_t, std::pair<uint64_t, T>> newest;  // key -> (version, record)
  const uint64_t used = std::min(t.high_water->load(std::memory_order_acquire), t.capacity);
  std::vector<uint32_t> garbage;
  for (uint32_t slot = 0; slot < used; ++slot) {
    SlotHead* h = t.head(slot);
    if (h->state.load(std::memory_order_acquire) != kLive) continue;
    T r;
    std::memcpy(&r, t.payload(slot), sizeof(T));
    if (Checksum(h->version, &r, sizeof(T)) != h->checksum) {
      ++*damaged;
      garbage.push_back(slot);
      continue;
    }
    r.slot = slot;
    auto [it, fresh] = newest.try_emplace(r.key(), h->version, r);
    if (!fresh) {
      ++*superseded;
      if (h->version > it->second.first) {
        garbage.push_back(it->second.second.slot);
        it->second = {h->version, r};
      } else {
        garbage.push_back(slot);
      }
    }
  }
  if (free_garbage) {
    for (uint32_t slot : garbage) t.head(slot)->state.store(0, std::memory_order_release);
  }
  std::vector<T> out;
  out.reserve(newest.size());
  for (auto& [key, vr] : newest) out.push_back(vr.second);
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DurableState>> DurableState::Open(const std::string& path,
                                                                  Snapshot* previous,
                                                                  std::string* note,
                                                                  Allocator allocate) {
  *previous = Snapshot();
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) {
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      return absl::FailedPreconditionError(absl::StrCat(
          "state ", path, ": cannot create directory ", dir.string(), ": ", ec.message()));
    }
  }
  std::unique_ptr<DurableState> s(new DurableState());
  s->path_ = path;
  s->allocate_ = allocate != nullptr ? std::move(allocate) : Allocator(&Fallocate);
  // Never through a link, and only a file of our own that nobody else may
  // write: the directory may be one others can write to.
  s->fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (s->fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("state ", path, ": cannot open: ", strerror(errno)));
  }
  if (flock(s->fd_, LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "state ", path, " is in use by another gpumemd (", strerror(errno),
        "); one daemon per state file"));
  }
  struct stat st;
  if (fstat(s->fd_, &st) != 0) {
    return absl::InternalError(absl::StrCat("state ", path, ": fstat: ", strerror(errno)));
  }
  if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "state ", path, " is not a regular file of uid ", geteuid(),
        " writable by it alone: refusing to trust it (remove it, or choose --state)"));
  }
  if ((st.st_mode & 077) != 0) {
    // Readable by others (an earlier version, a copy): what it holds names
    // every tenant's sessions and tokens.
    if (fchmod(s->fd_, 0600) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "state ", path, ": cannot tighten its mode ", absl::StrFormat("%04o", st.st_mode & 07777),
          " to 0600: ", strerror(errno)));
    }
    std::cerr << "gpumemd: state " << path << ": mode was "
              << absl::StrFormat("%04o", st.st_mode & 07777) << ", now 0600\n";
  }
  const size_t bytes = FileBytes();
  const std::string boot = BootId();
  // What an earlier daemon left: kept only if it is of this format and boot.
  bool adopt = false;
  std::string why = "new state file";
  if (st.st_size > 0) {
    Header h;
    if (st.st_size < static_cast<off_t>(sizeof(Header)) ||
        pread(s->fd_, &h, sizeof(Header), 0) != static_cast<ssize_t>(sizeof(Header))) {
      why = "the state file was too short to be one: started over";
    } else if (h.magic != kMagic || h.format != kFormat ||
               h.header_bytes != kHeaderBytes) {
      why = "the state file is not of this format: started over";
    } else if (std::string(h.boot_id, strnlen(h.boot_id, sizeof(h.boot_id))) != boot) {
      why = "the state file is from before a reboot (GPU memory does not survive one): "
            "started over";
    } else if (static_cast<size_t>(st.st_size) != bytes) {
      why = "the state file has other table sizes: started over";
    } else {
      adopt = true;
      why = "state left by a previous daemon of this boot";
    }
  }
  if (!adopt) {
    if (ftruncate(s->fd_, 0) != 0 || ftruncate(s->fd_, static_cast<off_t>(bytes)) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "state ", path, ": cannot size it to ", bytes, " bytes (sparse): ", strerror(errno)));
    }
  }
  // The header's page gets its disk space before anything touches it.
  if (int error = s->allocate_(s->fd_, 0, kHeaderBytes); error != 0) {
    return s->StartSpaceError(kHeaderBytes, error);
  }
  void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd_, 0);
  if (map == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("state ", path, ": mmap: ", strerror(errno)));
  }
  s->base_ = static_cast<char*>(map);
  s->mapped_ = bytes;
  Header* header = reinterpret_cast<Header*>(s->base_);
  if (!adopt) {
    std::memset(header, 0, kHeaderBytes);
    uint64_t offset = kHeaderBytes;
    for (int t = 0; t < kTables; ++t) {
      header->table_offset[t] = offset;
      header->slot_bytes[t] = kShapes[t].slot_bytes;
      header->capacity[t] = kShapes[t].capacity;
      offset += kShapes[t].slot_bytes * kShapes[t].capacity;
    }
    std::memcpy(header->boot_id, boot.data(), std::min(boot.size(), sizeof(header->boot_id) - 1));
    header->format = kFormat;
    header->header_bytes = kHeaderBytes;
    // The magic last: a file cut short while being made is not adopted.
    std::atomic_thread_fence(std::memory_order_release);
    header->magic = kMagic;
  }
  // Each table's first chunk, or every chunk the slots used so far need.
  uint64_t start_bytes = kHeaderBytes;
  for (int t = 0; t < kTables; ++t) {
    auto table = std::make_unique<Table>();
    table->base = s->base_ + header->table_offset[t];
    table->offset = header->table_offset[t];
    table->slot_bytes = header->slot_bytes[t];
    table->capacity = header->capacity[t];
    table->high_water = &header->high_water[t];
    table->name = kShapes[t].name;
    const uint64_t per = table->chunk_slots();
    const uint64_t used = std::min(table->high_water->load(), table->capacity);
    const uint64_t want = std::min(table->capacity, std::max<uint64_t>(1, (used + per - 1) / per) * per);
    start_bytes += want * table->slot_bytes;
    table->allocated.store(want);
    s->tables_.push_back(std::move(table));
  }
  for (const auto& table : s->tables_) {
    const uint64_t want = table->allocated.load() * table->slot_bytes;
    if (int error = s->allocate_(s->fd_, table->offset, want); error != 0) {
      return s->StartSpaceError(start_bytes, error);
    }
  }
  s->last_change_ns_ = &header->last_change_ns;
  if (adopt) {
    Snapshot& p = *previous;
    p.adopted = true;
    p.last_change_ns = header->last_change_ns.load();
    p.slabs = LoadTable<SlabRecord>(*s->tables_[kSlabs], &p.damaged, &p.superseded, true);
    p.allocations = LoadTable<AllocationRecordData>(*s->tables_[kAllocations], &p.damaged,
                                                    &p.superseded, true);
    p.sessions = LoadTable<SessionRecord>(*s->tables_[kSessions], &p.damaged, &p.superseded, true);
    p.holders = LoadTable<HolderRecord>(*s->tables_[kHolders], &p.damaged, &p.superseded, true);
    uint64_t max_version = 0;
    for (int t = 0; t < kTables; ++t) {
      Table& table = *s->tables_[t];
      const uint64_t used = std::min(table.high_water->load(), table.capacity);
      absl::MutexLock lock(&table.mu);
      for (uint32_t slot = 0; slot < used; ++slot) {
        if (table.head(slot)->state.load() != kLive) {
          table.free.push_back(slot);
        } else {
          max_version = std::max(max_version, table.head(slot)->version);
        }
      }
    }
    s->next_version_ = max_version + 1;
  }
  *note = absl::StrCat(why, " (", path, ")");
  return s;
}

DurableState::~DurableState() {
  if (base_ != nullptr) munmap(base_, mapped_);
  if (fd_ >= 0) close(fd_);
}

absl::Status DurableState::StartSpaceError(uint64_t bytes, int error) const {
  const std::string why = absl::StrCat(
      "state ", path_, ": cannot allocate ", bytes, " bytes for it on its filesystem (",
      strerror(error), "): a restart needs them; free space there, or choose --state "
      "(--state=none keeps nothing over a restart)");
  return NoSpace(error) ? absl::ResourceExhaustedError(why) : absl::InternalError(why);
}

absl::StatusOr<uint32_t> DurableState::Add(int table, const void* payload, size_t size) {
  if (frozen_.load(std::memory_order_relaxed)) {
    return absl::FailedPreconditionError(
        absl::StrCat("state ", path_, " is frozen: the daemon is stopping for a restart"));
  }
  Table& t = *tables_[table];
  uint32_t slot = kNoSlot;
  {
    absl::MutexLock lock(&t.mu);
    if (!t.free.empty()) {
      slot = t.free.back();
      t.free.pop_back();
    } else {
      const uint64_t next = t.high_water->load(std::memory_order_relaxed);
      if (next >= t.capacity) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "state table full: table ", t.name, " of ", path_, " holds its ", t.capacity,
            " records"));
      }
      const uint64_t allocated = t.allocated.load(std::memory_order_relaxed);
      if (next >= allocated) {
        // The next chunk gets its disk space before the mark may cover it.
        const uint64_t grown = std::min(t.capacity, allocated + t.chunk_slots());
        const int error = allocate_(fd_, t.offset + allocated * t.slot_bytes,
                                    (grown - allocated) * t.slot_bytes);
        if (error != 0) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "state table full: table ", t.name, " of ", path_, " cannot grow past ",
              allocated, " records (", allocated_bytes(), " bytes of the file allocated; the next ",
              (grown - allocated) * t.slot_bytes, " bytes: ", strerror(error),
              "): free space on its filesystem"));
        }
        t.allocated.store(grown, std::memory_order_relaxed);
      }
      // The mark covers the slot before anything is written to it.
      t.high_water->store(next + 1, std::memory_order_release);
      slot = static_cast<uint32_t>(next);
    }
  }
  SlotHead* h = t.head(slot);
  const uint64_t version = next_version_.fetch_add(1, std::memory_order_relaxed);
  std::memcpy(t.payload(slot), payload, size);
  h->version = version;
  h->checksum = Checksum(version, payload, size);
  h->state.store(kLive, std::memory_order_release);  // published
  last_change_ns_->store(absl::GetCurrentTimeNanos(), std::memory_order_relaxed);
  return slot;
}

uint32_t DurableState::Put(int table, const void* payload, size_t size) {
  absl::StatusOr<uint32_t> slot = Add(table, payload, size);
  if (slot.ok()) return *slot;
  if (absl::IsResourceExhausted(slot.status())) {
    Table& t = *tables_[table];
    absl::MutexLock lock(&t.mu);
    if (!t.warned_full) {
      t.warned_full = true;
      std::cerr << "gpumemd: " << slot.status().message()
                << "; records past it are not kept, so a restart would lose them\n";
    }
  }
  return kNoSlot;
}

void DurableState::Remove(int table, uint32_t slot) {
  if (slot == kNoSlot || frozen_.load(std::memory_order_relaxed)) return;
  Table& t = *tables_[table];
  t.head(slot)->state.store(0, std::memory_order_release);
  last_change_ns_->store(absl::GetCurrentTimeNanos(), std::memory_order_relaxed);
  absl::MutexLock lock(&t.mu);
  t.free.push_back(slot);
}

void DurableState::Clear() {
  for (auto& table : tables_) {
    absl::MutexLock lock(&table->mu);
    const uint64_t used = std::min(table->high_water->load(), table->capacity);
    for (uint32_t slot = 0; slot < used; ++slot) table->head(slot)->state.store(0);
    table->high_water->store(0);
    table->free.clear();
  }
}

uint32_t DurableState::PutSlab(const SlabRecord& r) { return Put(kSlabs, &r, sizeof(r)); }
uint32_t DurableState::PutAllocation(const AllocationRecordData& r) {
  return Put(kAllocations, &r, sizeof(r));
}
uint32_t DurableState::PutSession(const SessionRecord& r) {
  return Put(kSessions, &r, sizeof(r));
}
uint32_t DurableState::PutHolder(const HolderRecord& r) { return Put(kHolders, &r, sizeof(r)); }
absl::StatusOr<uint32_t> DurableState::AddSlab(const SlabRecord& r) {
  return Add(kSlabs, &r, sizeof(r));
}
absl::StatusOr<uint32_t> DurableState::AddAllocation(const AllocationRecordData& r) {
  return Add(kAllocations, &r, sizeof(r));
}
absl::StatusOr<uint32_t> DurableState::AddSession(const SessionRecord& r) {
  return Add(kSessions, &r, sizeof(r));
}
absl::StatusOr<uint32_t> DurableState::AddHolder(const HolderRecord& r) {
  return Add(kHolders, &r, sizeof(r));
}
void DurableState::RemoveSlab(uint32_t slot) { Remove(kSlabs, slot); }
void DurableState::RemoveAllocation(uint32_t slot) { Remove(kAllocations, slot); }
void DurableState::RemoveSession(uint32_t slot) { Remove(kSessions, slot); }
void DurableState::RemoveHolder(uint32_t slot) { Remove(kHolders, slot); }

Snapshot DurableState::Load() const {
  Snapshot p;
  p.slabs = LoadTable<SlabRecord>(*tables_[kSlabs], &p.damaged, &p.superseded, false);
  p.allocations =
      LoadTable<AllocationRecordData>(*tables_[kAllocations], &p.damaged, &p.superseded, false);
  p.sessions = LoadTable<SessionRecord>(*tables_[kSessions], &p.damaged, &p.superseded, false);
  p.holders = LoadTable<HolderRecord>(*tables_[kHolders], &p.damaged, &p.superseded, false);
  return p;
}

uint64_t DurableState::allocated_bytes() const {
  uint64_t bytes = kHeaderBytes;
  for (const auto& t : tables_) bytes += t->allocated.load(std::memory_order_relaxed) * t->slot_bytes;
  return bytes;
}

uint64_t DurableState::used_bytes() const {
  uint64_t bytes = kHeaderBytes;
  for (const auto& t : tables_) bytes += std::min(t->high_water->load(), t->capacity) * t->slot_bytes;
  return bytes;
}

}  // namespace state
}  // namespace gpumem
