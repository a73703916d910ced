// Events and folders the ledger's unit tests build their cases from.
#ifndef GPUMEMD_TESTS_LEDGER_LEDGER_TEST_EVENTS_H_
#define GPUMEMD_TESTS_LEDGER_LEDGER_TEST_EVENTS_H_

#include <stdlib.h>

#include <cstdint>
#include <string>

#include "server/ledger/ledger_event.h"

namespace gpumem {
namespace ledger {

// A fresh folder under /tmp.
inline std::string TempDir() {
  char tmpl[] = "/tmp/ledger-test-XXXXXX";
  return mkdtemp(tmpl);
}

// An ALLOCATE of `bytes` on `device` by uid 1000, pid 42, session 7.
inline LedgerEvent Alloc(uint64_t id, int32_t device, uint64_t bytes, int64_t t_ns,
                         const std::string& tenant = "ml") {
  LedgerEvent e;
  e.kind = EventKind::kAllocate;
  e.tenant = tenant;
  e.uid = 1000;
  e.pid = 42;
  e.session = 7;
  e.device = device;
  e.bytes = bytes;
  e.allocation_id = id;
  e.time_ns = t_ns;
  return e;
}

// The FREE of `a` at `t_ns`.
inline LedgerEvent Free(const LedgerEvent& a, int64_t t_ns) {
  LedgerEvent e = a;
  e.kind = EventKind::kFree;
  e.time_ns = t_ns;
  return e;
}

}  // namespace ledger
}  // namespace gpumem

#endif  // GPUMEMD_TESTS_LEDGER_LEDGER_TEST_EVENTS_H_
