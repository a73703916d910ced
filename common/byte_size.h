// Byte sizes as people write them: "4096", "64KiB", "1.5GiB", "2G", "16 MB".
//
// Binary and decimal suffixes both mean powers of 1024 (K, KB, KiB are all
// 1024), because GPU capacities are quoted that way. A fractional value is
// rounded down to a whole byte. Anything else is INVALID_ARGUMENT naming the
// text. FormatBytes is the inverse for humans ("1.50 GiB").
#ifndef GPUMEMD_COMMON_BYTE_SIZE_H_
#define GPUMEMD_COMMON_BYTE_SIZE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gpumem {

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

// "512 B", "64.0 KiB", "1.50 GiB".
std::string FormatBytes(uint64_t bytes);

// A device list: "4x16GiB" (count x size) or "80GiB,80GiB,40GiB", or a mix
// ("2x80GiB,40GiB"). At least one device, each of at least 1 MiB.
absl::StatusOr<std::vector<uint64_t>> ParseDeviceSizes(absl::string_view text);

}  // namespace gpumem

#endif  // GPUMEMD_COMMON_BYTE_SIZE_H_
