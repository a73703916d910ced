// ProcessOpenSlabs: which daemon slabs this process has open, over all its
// gpumem::Client objects, so that only the last of them to close a slab
// tells the daemon. The daemon counts a slab's holders per session, and
// every Client of one process is the same session; were one Client to tell
// the daemon it closed a slab another still has open, after a daemon
// restart the other could not give the handle back (only a holder may), and
// its blocks in that slab would be closed although they are mapped here.
//
// Invariants: a Client counts a slab before it asks the daemon for the
// handle and uncounts it when it closes it; the last Closing's `tell` runs
// under the registry's lock, so no Opening of the same slab can reach the
// daemon before it. Counts are per process (a fork() child starts from
// none), per daemon socket and per slab id. Thread-safe.
#ifndef GPUMEMD_CLIENT_LIB_CPP_PROCESS_OPEN_SLABS_H_
#define GPUMEMD_CLIENT_LIB_CPP_PROCESS_OPEN_SLABS_H_

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
  // One Client let go of it without telling the daemon (it is gone, or the
  // Client goes with its connection).
  static void Dropping(const std::string& socket_path, uint64_t slab_id);
};

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_CPP_PROCESS_OPEN_SLABS_H_
