// NewSlabMapper: the one switch from HandleKind to a mapper.
#include "client/lib/slabs/slab_mapper.h"

#include "absl/strings/str_cat.h"

namespace gpumem {
namespace client {

absl::StatusOr<std::unique_ptr<SlabMapper>> NewSlabMapper(v1::HandleKind kind,
                                                          const char* cuda_library) {
  switch (kind) {
    case v1::HANDLE_KIND_MEMFD:
      return NewMmapSlabMapper();
    case v1::HANDLE_KIND_CUDA_VMM_FD:
      return NewCudaVmmSlabMapper(cuda_library);
    case v1::HANDLE_KIND_CUDA_IPC:
      return NewCudaIpcSlabMapper(cuda_library);
    default:
      return absl::UnimplementedError(absl::StrCat(
          "this client cannot open slabs of handle kind ", v1::HandleKind_Name(kind)));
  }
}

}  // namespace client
}  // namespace gpumem
