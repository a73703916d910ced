// The records DurableState keeps (durable_state.h): plain fixed-size data,
// written into shared memory as they are, so nothing here may hold a
// pointer or a variable-length member. Each record has the key its table
// deduplicates on; `slot` is where DurableState found it (Load).
#ifndef GPUMEMD_SERVER_STATE_RECORDS_H_
#define GPUMEMD_SERVER_STATE_RECORDS_H_

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"

namespace gpumem {
namespace state {

// Fixed-size text: at most size - 1 bytes, NUL-padded.
inline void SetText(char* out, size_t size, absl::string_view text) {
  std::memset(out, 0, size);
  std::memcpy(out, text.data(), text.size() < size - 1 ? text.size() : size - 1);
}
inline std::string Text(const char* in, size_t size) { return std::string(in, strnlen(in, size)); }

// A slab: which device, how big, whose, how it is opened, and the identity
// of its handle (a memfd's inode and device numbers; 0 where the handle has
// none), so that a handle a client gives back can be checked.
struct SlabRecord {
  uint64_t slab_id = 0;
  uint64_t size = 0;
  uint64_t handle_ino = 0;
  uint64_t handle_dev = 0;
  uint32_t device = 0;
  uint32_t tenant = 0;
  uint8_t kind = 0;  // HandleKind
  uint8_t dedicated = 0;
  uint8_t reserved = 0;
  uint8_t retained = 0;
  char tenant_name[64] = {};  // tenant ids are one daemon's; names carry over
  uint32_t slot = 0;          // where Load found it (ignored in the file)
  uint64_t key() const { return slab_id; }
  void set_tenant_name(absl::string_view n) { SetText(tenant_name, sizeof(tenant_name), n); }
  std::string tenant_name_string() const { return Text(tenant_name, sizeof(tenant_name)); }
};

// A live allocation (the table's record, server/allocations/allocation_table.h).
struct AllocationRecordData {
  uint64_t id = 0;
  uint64_t session = 0;
  uint64_t slab_id = 0;
  uint64_t offset = 0;
  uint64_t size = 0;     // the block's bytes
  uint64_t charged = 0;  // bytes charged to quota and ledger (the size asked)
  int64_t time_ns = 0;   // when it was made
  // The Allocate's request_key (proto AllocateRequest), 0 for none: a retry
  // of that Allocate after a restart gets this allocation back.
  uint64_t request_key = 0;
  uint32_t uid = 0;
  int32_t pid = 0;
  uint32_t tenant = 0;
  uint32_t device = 0;
  uint32_t slot = 0;  // where Load found it (ignored in the file)
  uint64_t key() const { return id; }
};

// A session: its process (pid and the kernel's start time of that process,
// so a reused pid is told apart) or, for a connection-bound session, its
// token; who it is; the tenant it was fixed to, if any.
struct SessionRecord {
  uint64_t id = 0;
  uint64_t start_ticks = 0;  // /proc/PID/stat field 22; 0 for bound sessions
  int32_t pid = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t tenant = 0;
  uint8_t bound = 0;
  uint8_t tenant_fixed = 0;
  // Opened through its tenant's own socket (PeerCred::socket_tenant): the
  // tenant named here is its principal, whatever its uid.
  uint8_t via_socket = 0;
  char token[34] = {};        // 32 hex characters and a NUL
  char tenant_name[64] = {};  // when tenant_fixed
  uint32_t slot = 0;          // where Load found it (ignored in the file)
  uint64_t key() const { return id; }
  void set_token(absl::string_view t) { SetText(token, sizeof(token), t); }
  std::string token_string() const { return Text(token, sizeof(token)); }
  void set_tenant_name(absl::string_view n) { SetText(tenant_name, sizeof(tenant_name), n); }
  std::string tenant_name_string() const { return Text(tenant_name, sizeof(tenant_name)); }
};

// A session was given a slab's handle.
struct HolderRecord {
  uint64_t slab_id = 0;
  uint64_t session = 0;
  uint32_t slot = 0;  // where Load found it (ignored in the file)
  uint64_t key() const { return slab_id * 0x9E3779B97F4A7C15ull ^ session; }
};

}  // namespace state
}  // namespace gpumem

#endif  // GPUMEMD_SERVER_STATE_RECORDS_H_
