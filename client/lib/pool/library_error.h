// The library's own error codes (GPUMEM_E_FOREIGN_POINTER .. GPUMEM_E_FORKED
// in gpumem.h, the one list of codes for the C ABI and the pool) carried on
// an absl::Status: the nearest standard code, with the library code as a
// payload.
//
// Invariant: LibraryCodeOf(LibraryError(code, m)) == code; any other status
// gives its standard code (0 for OK).
#ifndef GPUMEMD_CLIENT_LIB_POOL_LIBRARY_ERROR_H_
#define GPUMEMD_CLIENT_LIB_POOL_LIBRARY_ERROR_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "client/lib/include/gpumem.h"

namespace gpumem {
namespace client {

absl::Status LibraryError(int code, absl::string_view message);
// What every call of a pool inherited through fork() answers.
absl::Status ForkedError();
int LibraryCodeOf(const absl::Status& s);

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_POOL_LIBRARY_ERROR_H_
