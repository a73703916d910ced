// DurableState: what the daemon must carry over a restart (its slabs, the
// allocations in them, the sessions that own them and hold their handles,
// the names of their tenants), kept in a file that outlives the process: on
// tmpfs (by default `<socket>.state`), it survives a crash, kill -9, an
// upgrade, a stop and start, and a container's restart when the directory
// is a hostPath; not a reboot, where GPU memory is gone anyway.
//
// The file is mapped shared, so every store is in the page cache the moment
// it is made, and a process that dies leaves exactly the stores it made.
// Each record lives in a fixed-size slot, written field by field while its
// state word says free and published by one atomic release store of that
// word: a record is at any instant wholly there or absent (no fsync, no
// journal, no torn record). A checksum drops a slot damaged any other way; a
// version makes the newer of two copies of a key win. Thread-safe: any
// thread may Put and Remove; a slot is only written by the thread that took it.
#ifndef GPUMEMD_SERVER_STATE_DURABLE_STATE_H_
#define GPUMEMD_SERVER_STATE_DURABLE_STATE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/state/records.h"

namespace gpumem {
namespace state {

// Where a record lives; kNoSlot when it was not kept.
inline constexpr uint32_t kNoSlot = UINT32_MAX;

// Everything a file held, as Load found it.
struct Snapshot {
  std::vector<SlabRecord> slabs;
  std::vector<AllocationRecordData> allocations;
  std::vector<SessionRecord> sessions;
  std::vector<HolderRecord> holders;
  // Slots with a bad checksum, and older copies of an updated key.
  uint64_t damaged = 0;
  uint64_t superseded = 0;
  // The file was an earlier daemon's (of this boot): what it lacks was not
  // live; and when that daemon last changed it (Unix ns).
  bool adopted = false;
  int64_t last_change_ns = 0;
  bool empty() const {
    return slabs.empty() && allocations.empty() && sessions.empty() && holders.empty();
  }
};

// Bytes allocated at a time for a table that grows (1 MiB: about 8,700
// allocation records). Disk space is allocated before it is used
// (posix_fallocate), a chunk per table as the table grows: no store into the
// mapping ever touches a page the filesystem has not given, so a full tmpfs
// never raises SIGBUS. Tables and capacities are fixed at creation (a slot
// costs memory only once its chunk is allocated): see kShapes in
// durable_state.cc.
inline constexpr uint64_t kChunkBytes = uint64_t{1} << 20;

// Gives the file the disk space of [offset, offset + bytes): 0 or an errno
// (posix_fallocate's contract). Tests replace it to run out of space where
// they cannot mount a small tmpfs.
using Allocator = absl::AnyInvocable<int(int fd, uint64_t offset, uint64_t bytes)>;

class DurableState {
 public:
  // Opens `path` (its directory is created if missing). `previous` receives
  // what the file held when it was written by an earlier daemon of this boot
  // (empty for a new file), and `note` one line saying what was found.
  // `allocate`: posix_fallocate when empty.
  // Makes the file (mode 0600 whatever the umask) or adopts one a previous
  // daemon left on this boot, and holds an exclusive flock on it; a second
  // daemon is refused naming the file. A file from another boot (kernel boot
  // id), of another format or another version is started over, saying why.
  // An existing file others may read is tightened to 0600 (fchmod, said on
  // stderr); one others may write is refused. Open allocates the header and
  // each table's first chunk (or, adopting, every chunk the last daemon
  // used) and fails naming the file and the bytes when it cannot.
  static absl::StatusOr<std::unique_ptr<DurableState>> Open(const std::string& path,
                                                            Snapshot* previous,
                                                            std::string* note,
                                                            Allocator allocate = nullptr);
  ~DurableState();
  DurableState(const DurableState&) = delete;
  DurableState& operator=(const DurableState&) = delete;

  // Forgets every record (a daemon that releases everything at its stop).
  void Clear();
  // From now on Put and Remove change nothing (Put answers kNoSlot): a
  // daemon stopping for a restart leaves the file as it is to the next.
  void Freeze() { frozen_.store(true); }

  // The slot that holds the record (for Remove), or RESOURCE_EXHAUSTED when
  // the table is full (its capacity, or a chunk the disk cannot give: "state
  // table full" naming the file, the table and the figures): the record is
  // not kept, nothing else changes, and records already kept, freed slots
  // and Remove keep working. Put* are Add* answering kNoSlot instead (the
  // daemon says so once per table; a restart would lose that record).
  absl::StatusOr<uint32_t> AddSlab(const SlabRecord& r);
  absl::StatusOr<uint32_t> AddAllocation(const AllocationRecordData& r);
  absl::StatusOr<uint32_t> AddSession(const SessionRecord& r);
  absl::StatusOr<uint32_t> AddHolder(const HolderRecord& r);
  uint32_t PutSlab(const SlabRecord& r);
  uint32_t PutAllocation(const AllocationRecordData& r);
  uint32_t PutSession(const SessionRecord& r);
  uint32_t PutHolder(const HolderRecord& r);
  void RemoveSlab(uint32_t slot);
  void RemoveAllocation(uint32_t slot);
  void RemoveSession(uint32_t slot);
  void RemoveHolder(uint32_t slot);

  // Reads the file as a restarted daemon would (tests, diagnostics): every
  // record that is wholly there, deduplicated by key, newest version first,
  // and what it dropped.
  Snapshot Load() const;

  const std::string& path() const { return path_; }
  // Bytes of the file in use (slots ever written).
  uint64_t used_bytes() const;
  // Bytes of the file given disk space so far (header and chunks).
  uint64_t allocated_bytes() const;

  struct Table;  // durable_state.cc

 private:
  DurableState() = default;
  absl::StatusOr<uint32_t> Add(int table, const void* payload, size_t size);
  uint32_t Put(int table, const void* payload, size_t size);
  // Open's error when the disk space it needs cannot be had.
  absl::Status StartSpaceError(uint64_t bytes, int error) const;
  void Remove(int table, uint32_t slot);

  std::string path_;
  int fd_ = -1;
  char* base_ = nullptr;
  size_t mapped_ = 0;
  std::atomic<uint64_t> next_version_{1};
  std::atomic<bool> frozen_{false};
  std::atomic<int64_t>* last_change_ns_ = nullptr;  // in the file's header
  Allocator allocate_;
  std::vector<std::unique_ptr<Table>> tables_;
};

}  // namespace state
}  // namespace gpumem

#endif  // GPUMEMD_SERVER_STATE_DURABLE_STATE_H_
