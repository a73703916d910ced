#include "server/placement/refusal.h"

#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/byte_size.h"

namespace gpumem {
namespace placement {

using ::gpumem::v1::DeviceRefusal;
using ::gpumem::v1::PlacementRefusal;

namespace {

std::string DescribeDevice(const DeviceRefusal& d) {
  std::string out = absl::StrCat("device ", d.device_index());
  if (!d.device_uuid().empty())
    absl::StrAppend(&out, " (", d.device_uuid(), ")");
  absl::StrAppend(&out, ": ");
  switch (d.reason()) {
    case DeviceRefusal::REASON_CAPACITY:
      absl::StrAppend(&out, "capacity, ", FormatBytes(d.free_bytes()), " free");
      break;
    case DeviceRefusal::REASON_FRAGMENTATION:
      absl::StrAppend(&out, "fragmentation, largest free range ",
                      FormatBytes(d.largest_free_bytes()), " of ",
                      FormatBytes(d.free_bytes()), " free");
      break;
    case DeviceRefusal::REASON_QUOTA:
      absl::StrAppend(&out, "quota");
      break;
    case DeviceRefusal::REASON_EXCLUDED:
      absl::StrAppend(&out, "excluded");
      break;
    case DeviceRefusal::REASON_HOLDS_SHARD:
      absl::StrAppend(&out, "holds shard ", d.shard_index());
      break;
    default:
      absl::StrAppend(&out, "refused");
      break;
  }
  if (!d.detail().empty()) absl::StrAppend(&out, " (", d.detail(), ")");
  return out;
}

}  // namespace

std::string DescribeRefusal(const PlacementRefusal& refusal) {
  std::string out;
  if (refusal.shard_count() > 0) {
    out =
        absl::StrCat("cannot place shard ", refusal.shard_index(), " (",
                     FormatBytes(refusal.size_bytes()), ") of ",
                     refusal.shard_count(), " shards totalling ",
                     FormatBytes(refusal.total_bytes()), "; no shard was kept");
  } else {
    out = absl::StrCat("cannot place ", FormatBytes(refusal.size_bytes()));
  }
  if (refusal.devices().empty()) {
    absl::StrAppend(&out, ": no device to try");
    return out;
  }
  std::vector<std::string> parts;
  parts.reserve(refusal.devices_size());
  for (const DeviceRefusal& d : refusal.devices()) {
    parts.push_back(DescribeDevice(d));
  }
  absl::StrAppend(&out, ": ", absl::StrJoin(parts, "; "));
  return out;
}

absl::Status RefusalStatus(const PlacementRefusal& refusal) {
  absl::Status status = absl::ResourceExhaustedError(DescribeRefusal(refusal));
  status.SetPayload(kPlacementRefusalTypeUrl,
                    absl::Cord(refusal.SerializeAsString()));
  return status;
}

}  // namespace placement
}  // namespace gpumem
