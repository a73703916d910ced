#include "server/ledger/usage_account.h"

#include <algorithm>

namespace gpumem {
namespace ledger {

namespace {

void Fold(UsageRow& row, int sign, const LedgerEvent& e) {
  if (row.updated_ns != 0 && e.time_ns > row.updated_ns) {
    row.byte_seconds += static_cast<double>(row.current_bytes) *
                        (static_cast<double>(e.time_ns - row.updated_ns) / 1e9);
  }
  row.updated_ns = std::max(row.updated_ns, e.time_ns);
  if (sign > 0) {
    row.current_bytes += e.bytes;
    row.peak_bytes = std::max(row.peak_bytes, row.current_bytes);
  } else {
    row.current_bytes -= std::min(row.current_bytes, e.bytes);
  }
}

}  // namespace

bool UsageAccount::Apply(const LedgerEvent& e) {
  const int sign = UsageSign(e.kind);
  if (sign == 0 || e.device < 0) return false;
  Fold(rows_[Key(e.tenant, e.device)], sign, e);
  Fold(rows_[Key(e.tenant, kAllDevices)], sign, e);
  return true;
}

}  // namespace ledger
}  // namespace gpumem
