#include "client/lib/cpp/process_open_slabs.h"

#include <unistd.h>

#include <map>
#include <tuple>

#include "absl/synchronization/mutex.h"

namespace gpumem {
namespace client {

namespace {

struct Registry {
  absl::Mutex mu;
  // (pid, socket, slab) -> Clients with it open. The pid keeps a fork()
  // child, which inherits a copy, from counting its parent's opens.
  std::map<std::tuple<pid_t, std::string, uint64_t>, int> open ABSL_GUARDED_BY(mu);
};

Registry& TheRegistry() {
  static Registry* registry = new Registry;  // never destroyed: used at exit
  return *registry;
}

}  // namespace

void ProcessOpenSlabs::Opening(const std::string& socket_path, uint64_t slab_id) {
  Registry& r = TheRegistry();
  absl::MutexLock lock(&r.mu);
  ++r.open[{getpid(), socket_path, slab_id}];
}

void ProcessOpenSlabs::Closing(const std::string& socket_path, uint64_t slab_id,
                               const std::function<void()>& tell) {
  Registry& r = TheRegistry();
  absl::MutexLock lock(&r.mu);
  auto it = r.open.find({getpid(), socket_path, slab_id});
  if (it != r.open.end() && --it->second > 0) return;  // another Client has it open
  if (it != r.open.end()) r.open.erase(it);
  tell();  // under the lock: no Opening of it reaches the daemon first
}

void ProcessOpenSlabs::Dropping(const std::string& socket_path, uint64_t slab_id) {
  Registry& r = TheRegistry();
  absl::MutexLock lock(&r.mu);
  auto it = r.open.find({getpid(), socket_path, slab_id});
  if (it != r.open.end() && --it->second <= 0) r.open.erase(it);
}

}  // namespace client
}  // namespace gpumem
