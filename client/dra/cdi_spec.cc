// CDI JSON: {cdiVersion, kind, devices[{name, containerEdits{env, mounts}}]};
// mounts[{hostPath, containerPath, options}] as in the CDI specification.
#include "client/dra/cdi_spec.h"

#include "absl/strings/str_cat.h"

namespace gpumem {
namespace dra {
namespace {

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos || slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

std::string CdiKind(const CdiConfig& c) { return c.driver + "/claim"; }

std::string CdiDeviceId(const CdiConfig& c, const std::string& uid) {
  return absl::StrCat(CdiKind(c), "=", uid);
}

std::string CdiSpecPath(const CdiConfig& c, const std::string& uid) {
  return absl::StrCat(c.dir, "/", c.driver, "-claim_", uid, ".json");
}

nlohmann::json CdiSpec(const CdiConfig& c, const std::string& uid, const std::string& host_dir) {
  return {
      {"cdiVersion", "0.5.0"},
      {"kind", CdiKind(c)},
      {"devices",
       {{{"name", uid},
         {"containerEdits",
          {{"env", {"GPUMEMD_SOCKET=" + c.container_socket}},
           {"mounts",
            {{{"hostPath", host_dir},
              {"containerPath", DirName(c.container_socket)},
              {"options", {"rbind", "ro", "nosuid", "nodev", "noexec"}}}}}}}}}},
  };
}

}  // namespace dra
}  // namespace gpumem
