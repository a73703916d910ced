// ProcessOpenSlabs: which daemon slabs this process has open, over all its
// gpumem::Client objects, so that only the last of them to close a slab
// tells the daemon.
//
// The daemon counts a slab's holders per session, and every Client of one
// process is the same session (a C ABI pool and a C++ Client side by side,
// say). Were one Client to tell the daemon it closed a slab while another
// still has it open, the daemon would forget that this process holds the
// slab's handle; after a daemon restart the other Client could not give the
// handle back (only a holder may), and its blocks in that slab would be
// closed at the end of the grace time although they are mapped here.
//
// Invariants: a Client counts a slab before it asks the daemon for the
// handle (Opening) and uncounts it when it closes it (Closing, or Dropping
// when the daemon is not to be told: it is gone, or the Client goes with
// its connection). The last Closing runs its `tell` under the registry's
// lock, so no Opening of the same slab can reach the daemon before it.
// Counts are per process (a fork() child starts from none), per daemon
// socket and per slab id.
// Thread-safe.
#ifndef GPUMEMD_CLIENT_PROCESS_OPEN_SLABS_H_
#define GPUMEMD_CLIENT_PROCESS_OPEN_SLABS_H_

#include <cstdint>
#include <functional>
#include <string>

namespace gpumem {
namespace client {

class ProcessOpenSlabs {
 public:
  // One more Client of this process is opening slab `slab_id` of the daemon
  // at `socket_path`.
  static void Opening(const std::string& socket_path, uint64_t slab_id);
  // One Client closed it; runs `tell` (telling the daemon) if it was the
  // last of this process to have it open.
  static void Closing(const std::string& socket_path, uint64_t slab_id,
                      const std::function<void()>& tell);
  // One Client let go of it without telling the daemon.
  static void Dropping(const std::string& socket_path, uint64_t slab_id);
};

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_PROCESS_OPEN_SLABS_H_
