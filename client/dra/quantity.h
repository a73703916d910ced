// Kubernetes resource quantities ("8Gi", "1500M", "8589934592") as byte
// counts: what a ResourceSlice's capacity and a claim's consumedCapacity
// carry.
//
// ParseQuantityBytes accepts the API server's quantity grammar (sign, digits,
// optional fraction, then a binary suffix Ki..Ei, a decimal suffix n..E, or
// a decimal exponent e/E) and rounds a fractional byte count up, as
// Kubernetes' Quantity.Value() does. Negative values and values beyond
// uint64 are errors, never clamped. FormatQuantityBytes writes the canonical
// binary form: the largest of Ki..Ei that divides the value, else the plain
// integer.
#ifndef GPUMEMD_CLIENT_DRA_QUANTITY_H_
#define GPUMEMD_CLIENT_DRA_QUANTITY_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gpumem {
namespace dra {

// INVALID_ARGUMENT naming the text when it is not a quantity, is negative,
// or does not fit in uint64 bytes.
absl::StatusOr<uint64_t> ParseQuantityBytes(absl::string_view text);

std::string FormatQuantityBytes(uint64_t bytes);

}  // namespace dra
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_DRA_QUANTITY_H_
