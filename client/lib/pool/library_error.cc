#include "client/lib/pool/library_error.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace gpumem {
namespace client {
namespace {
constexpr char kLibraryCodeUrl[] = "gpumem.client/library-code";
}  // namespace

absl::Status LibraryError(int code, absl::string_view message) {
  absl::StatusCode near = absl::StatusCode::kFailedPrecondition;
  if (code == GPUMEM_E_FOREIGN_POINTER || code == GPUMEM_E_DOUBLE_FREE) {
    near = absl::StatusCode::kInvalidArgument;
  } else if (code == GPUMEM_E_LOST) {
    near = absl::StatusCode::kDataLoss;
  }
  absl::Status s(near, message);
  s.SetPayload(kLibraryCodeUrl, absl::Cord(absl::StrCat(static_cast<int>(code))));
  return s;
}

absl::Status ForkedError() {
  return LibraryError(GPUMEM_E_FORKED,
                      "this client belongs to the parent process (fork() child); "
                      "connect a new client in the child");
}

int LibraryCodeOf(const absl::Status& s) {
  auto p = s.GetPayload(kLibraryCodeUrl);
  int code = 0;
  if (p.has_value() && absl::SimpleAtoi(std::string(*p), &code)) return code;
  return s.raw_code();
}

}  // namespace client
}  // namespace gpumem
