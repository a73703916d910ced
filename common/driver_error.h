// The payload URL that marks an absl::Status as a device driver's own error
// (common/cuda_driver.h sets it; the value is the driver's error code in
// decimal). The pool and the broker use it to tell "the driver refused" from
// their own refusals, so a driver's out-of-memory reaches the caller with the
// driver's words. Header only, no dependencies.
#ifndef GPUMEMD_COMMON_DRIVER_ERROR_H_
#define GPUMEMD_COMMON_DRIVER_ERROR_H_

namespace gpumem {

inline constexpr char kDriverErrorPayload[] = "type.gpumem/driver_error";

}  // namespace gpumem

#endif  // GPUMEMD_COMMON_DRIVER_ERROR_H_
