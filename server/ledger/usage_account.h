// UsageAccount: per-tenant, per-device usage figures folded from events:
// bytes held now, the most held at once, and byte-seconds (the integral of
// held bytes over time).
//
// Each tenant also has a row for device kAllDevices (-1): its figures over
// all devices together (its peak is the most held at once in total, which
// the per-device peaks cannot give).
// Byte-seconds accrue between events at the bytes held: an event at time t
// first adds current * (t - updated) to the row, then changes current. Time
// never runs backwards in a row (an older timestamp accrues nothing). A
// row's figures are a pure function of the events applied to it, so the
// ledger's stored usage table can be checked against its events.
// Not thread-safe: owned by the ledger's writer.
#ifndef GPUMEMD_SERVER_LEDGER_USAGE_ACCOUNT_H_
#define GPUMEMD_SERVER_LEDGER_USAGE_ACCOUNT_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "server/ledger/ledger_event.h"

namespace gpumem {
namespace ledger {

struct UsageRow {
  uint64_t current_bytes = 0;
  uint64_t peak_bytes = 0;
  double byte_seconds = 0;
  int64_t updated_ns = 0;  // time of the last event applied
};

class UsageAccount {
 public:
  using Key = std::pair<std::string, int32_t>;  // tenant, device
  static constexpr int32_t kAllDevices = -1;

  // Folds one event in (its device row and the tenant's kAllDevices row);
  // false for events that change no usage.
  bool Apply(const LedgerEvent& e);
  // Seeds a row (from the stored table at start).
  void Set(const Key& key, const UsageRow& row) { rows_[key] = row; }

  const std::map<Key, UsageRow>& rows() const { return rows_; }

 private:
  std::map<Key, UsageRow> rows_;
};

}  // namespace ledger
}  // namespace gpumem

#endif  // GPUMEMD_SERVER_LEDGER_USAGE_ACCOUNT_H_
