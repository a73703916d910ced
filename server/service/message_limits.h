// MessageLimits: the largest request each gRPC method of gpumem.v1 takes,
// well below gRPC's 4 MiB default, so no caller makes the daemon keep or
// work on more than a method really needs.
//
// Invariants: every method has a fixed limit from its real need (a request
// the method's own checks could accept; Resume's, a page of blocks: the
// client library sends a larger Resume in pages), all within the
// server-wide max_receive_message_size, which gRPC enforces before a
// request is parsed. A request over its method's limit is answered
// RESOURCE_EXHAUSTED naming the method, its size and the limit, before any
// of its work starts; a Stream message is measured before it is parsed.
#ifndef GPUMEMD_SERVER_SERVICE_MESSAGE_LIMITS_H_
#define GPUMEMD_SERVER_SERVICE_MESSAGE_LIMITS_H_

#include <cstddef>
#include <cstdint>

#include <google/protobuf/message.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace gpumem {

// Requests without a list in them (Free, GetStats, GetSession, GetUsage,
// GetLedger, DeleteTenant): ids, flags, a tenant's name, a page token.
inline constexpr size_t kSmallRequestLimit = size_t{4} << 10;
// Allocate, and each Stream message (one Allocate, Free or GetSession): a
// placement's lists at their most (placement/resolve.h: 10 lists of up to
// 4 selectors per device, of up to 64 bytes each) for up to 16 devices
// (about 42 KiB), and one naming each device once per list by its UUID for
// up to 64 devices (about 27 KiB).
inline constexpr size_t kAllocateRequestLimit = size_t{64} << 10;
// SetQuota and PutTenant: a name (63 bytes at most), a socket path (107)
// and a quota of each device by UUID (about 55 bytes): up to 250 devices.
inline constexpr size_t kTenantRequestLimit = size_t{16} << 10;
// Resume: a page of the blocks a client holds (each about 90 bytes, 160
// with a CUDA IPC handle); the client library sends 1,000 a page.
inline constexpr size_t kResumeRequestLimit = size_t{256} << 10;

// The fixed limit of a unary method's request type ("gpumem.v1.FreeRequest").
// A type this table does not know gets kSmallRequestLimit.
size_t RequestLimit(absl::string_view request_type);

// OK, or RESOURCE_EXHAUSTED naming the method, the request's size
// (ByteSizeLong: what it holds once parsed, unknown fields included) and its
// limit.
absl::Status CheckRequestSize(const google::protobuf::Message& request);

// OK, or RESOURCE_EXHAUSTED, for the `index`th message of a Stream, of
// `bytes` on the wire (checked before it is parsed).
absl::Status CheckStreamMessageSize(uint64_t index, size_t bytes);

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_MESSAGE_LIMITS_H_
