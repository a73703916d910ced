// Names of HandleKind, as --handle_kinds and the config spell them; the
// default Backend::AdoptSlab.
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "server/backend/backend.h"

namespace gpumem {

const char* HandleKindName(HandleKind kind) {
  switch (kind) {
    case HandleKind::kMemfd: return "memfd";
    case HandleKind::kCudaVmmFd: return "cuda_vmm_fd";
    case HandleKind::kCudaIpc: return "cuda_ipc";
  }
  return "unknown";
}

absl::StatusOr<HandleKind> ParseHandleKind(const std::string& name) {
  for (HandleKind k : {HandleKind::kMemfd, HandleKind::kCudaVmmFd, HandleKind::kCudaIpc}) {
    if (name == HandleKindName(k)) return k;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown handle kind '", name, "' (known: memfd, cuda_vmm_fd, cuda_ipc)"));
}

std::optional<HandleKind> HandleKindFromRecord(uint8_t value) {
  for (HandleKind k : {HandleKind::kMemfd, HandleKind::kCudaVmmFd, HandleKind::kCudaIpc}) {
    if (value == HandleKindToRecord(k)) return k;
  }
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<Slab>> Backend::AdoptSlab(uint32_t, uint64_t, HandleKind kind,
                                                        int fd, const SlabIdentity&) {
  if (fd >= 0) close(fd);
  return absl::UnimplementedError(absl::StrCat(
      "the ", name(), " backend cannot take back ", HandleKindName(kind), " slabs"));
}

}  // namespace gpumem
