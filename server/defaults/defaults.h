// The built-in defaults of the daemon's settings that a part's own option
// struct also starts from (PoolOptions, BrokerOptions, AdmissionOptions,
// ConnectionLimitSettings, ReflectionLimits, the tenant directory), named
// once here. The settings table (server/config/setting_table.h) names them
// as its defaults; a setting whose default no option struct shares keeps it
// in its row alone.
//
// A leaf: it includes nothing of the daemon, so any part may include it.
#ifndef GPUMEMD_SERVER_DEFAULTS_DEFAULTS_H_
#define GPUMEMD_SERVER_DEFAULTS_DEFAULTS_H_

#include <cstdint>

#include "absl/time/time.h"

namespace gpumem {
namespace defaults {

// The pool (server/pool/slab_pool.h: PoolOptions).
inline constexpr uint64_t kSlabSize = uint64_t{1} << 30;
inline constexpr uint64_t kMinSlabSize = uint64_t{2} << 20;
inline constexpr absl::Duration kEmptySlabRelease = absl::Seconds(30);
inline constexpr double kReserveFraction = 0.0;

// The core (server/core/memory_broker.h: BrokerOptions).
inline constexpr uint64_t kMaxAlignment = uint64_t{2} << 20;
inline constexpr absl::Duration kRestoreGrace = absl::Seconds(30);
inline constexpr absl::Duration kReclaimWait = absl::Milliseconds(300);

// Waiting (server/admission/admission.h: AdmissionOptions; the tenant
// directory's max_waiting_requests).
inline constexpr uint32_t kMaxWaitingRequests = 1024;
inline constexpr uint32_t kWaitBypassLimit = 8;
inline constexpr absl::Duration kWaitReserve = absl::Seconds(2);

// Connections (server/service/connection_limits.h) and server reflection
// (server/service/reflection_service.h).
inline constexpr uint32_t kMaxConnectionsPerUid = 256;
inline constexpr uint32_t kMaxConnectionsPerTenantSocket = 1024;
inline constexpr uint32_t kFdReserve = 256;
inline constexpr uint32_t kMaxReflectionStreamsPerUid = 4;

}  // namespace defaults
}  // namespace gpumem

#endif  // GPUMEMD_SERVER_DEFAULTS_DEFAULTS_H_
