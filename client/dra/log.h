// One line to stderr per event, "gpumemd-dra: ...", whole lines only (the
// kubelet plugin's log is the container's stderr).
#ifndef GPUMEMD_CLIENT_DRA_LOG_H_
#define GPUMEMD_CLIENT_DRA_LOG_H_

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"

namespace gpumem {
namespace dra {

template <typename... Args>
void Log(const Args&... args) {
  const std::string line = absl::StrCat("gpumemd-dra: ", args..., "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace dra
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_DRA_LOG_H_
