// Block: what the pool's layers hand each other (block_resource.h), and
// ReuseAfter: the rule a free names for when the block may be used again.
//
// A block is either carved from a lease (lease set: its allocator handle
// and size class travel with it) or a whole daemon allocation (lease null).
// On the way down after a free, a whole block carries its Buffer (`whole`):
// it left the lease source's table when it was freed, so it is in exactly
// one place until it is given back.
#ifndef GPUMEMD_CLIENT_LIB_POOL_BLOCK_H_
#define GPUMEMD_CLIENT_LIB_POOL_BLOCK_H_

#include <cstdint>
#include <memory>
#include <string>

#include "client/lib/cpp/client.h"
#include "client/lib/pool/lease.h"
#include "proto/gpumem/v1/gpumem.pb.h"

namespace gpumem {
namespace client {

struct Block {
  uintptr_t ptr = 0;
  uint64_t bytes = 0;             // the class size, or the whole allocation's size
  Lease* lease = nullptr;         // carved from this lease, or null: a whole block
  uint32_t handle = 0;            // the lease allocator's handle
  uint32_t cls = 0;               // the size class
  std::unique_ptr<Buffer> whole;  // a freed whole block's allocation
};

// Device memory (a CUDA handle kind), whose frees wait for device work;
// host memory (memfd, the sim backend) is reusable at once.
inline bool IsDeviceMemory(const Buffer& b) {
  const v1::HandleKind k = b.allocation().handle_kind();
  return k != v1::HANDLE_KIND_MEMFD && k != v1::HANDLE_KIND_UNSPECIFIED;
}

inline bool OnDevice(const Block& b) {
  if (b.lease != nullptr) return b.lease->on_device;
  return b.whole != nullptr && IsDeviceMemory(*b.whole);
}

// The UUID of the device of a block that is on one.
inline const std::string& DeviceUuid(const Block& b) {
  return b.lease != nullptr ? b.lease->uuid : b.whole->device_uuid();
}

// When a freed block may be used again: after all the work this process
// queued on its device before the free (Free), or after the work queued on
// one stream (FreeAfterStream). Only device memory waits.
struct ReuseAfter {
  bool stream_ordered = false;
  void* stream = nullptr;  // a CUstream of the device's primary context; null: its NULL stream

  static ReuseAfter DeviceWork() { return {}; }
  static ReuseAfter StreamWork(void* stream) { return {true, stream}; }
};

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_POOL_BLOCK_H_
