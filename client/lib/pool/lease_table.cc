#include "client/lib/pool/lease_table.h"

namespace gpumem {
namespace client {

void LeaseTable::Publish(std::vector<Lease*> leases) {
  std::sort(leases.begin(), leases.end(),
            [](const Lease* a, const Lease* b) { return a->base < b->base; });
  auto s = std::make_unique<Snapshot>();
  s->base.reserve(leases.size());
  for (const Lease* l : leases) s->base.push_back(l->base);
  s->lease = std::move(leases);
  current_.store(s.get(), std::memory_order_release);
  published_.push_back(std::move(s));
}

}  // namespace client
}  // namespace gpumem
