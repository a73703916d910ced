#include "server/tenants/tenant.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace gpumem {
namespace tenants {

namespace {
constexpr absl::string_view kUidPrefix = "uid-";
}  // namespace

std::string UidTenantName(uint32_t uid) { return absl::StrCat(kUidPrefix, uid); }

std::optional<uint32_t> UidOfTenantName(absl::string_view name) {
  uint32_t uid = 0;
  if (absl::ConsumePrefix(&name, kUidPrefix) && absl::SimpleAtoi(name, &uid)) return uid;
  return std::nullopt;
}

}  // namespace tenants
}  // namespace gpumem
