// Parse with locations, then validate field by field; the first error wins
// and is reported at the line of the field that holds it.
#include "server/config/daemon_config.h"

#include <grp.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "server/backend/sim_topology.h"

namespace gpumem {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::TextFormat;

// Keeps the parser's first complaint with its place.
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (!message_.empty()) return;
    line_ = line;
    column_ = column;
    message_ = message;
  }
  int line_ = 0;
  int column_ = 0;
  std::string message_;
};

// Where a field was written: "NAME:LINE:COL" (1-based), or "NAME" when the
// parser recorded no place.
std::string Where(const std::string& name, const TextFormat::ParseInfoTree* tree,
                  const FieldDescriptor* field) {
  if (tree == nullptr) return name;
  TextFormat::ParseLocation at = tree->GetLocation(field, -1);
  if (at.line < 0) return name;
  return absl::StrCat(name, ":", at.line + 1, ":", at.column + 1);
}

absl::Status Bad(const std::string& where, absl::string_view field,
                 absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", field, ": ", why));
}

}  // namespace

absl::StatusOr<v1::DaemonConfig> ParseDaemonConfig(
    const std::string& name, const std::string& text,
    TextFormat::ParseInfoTree* locations) {
  v1::DaemonConfig config;
  TextFormat::Parser parser;
  FirstError errors;
  TextFormat::ParseInfoTree own_tree;
  TextFormat::ParseInfoTree& tree = locations != nullptr ? *locations : own_tree;
  parser.RecordErrorsTo(&errors);
  parser.WriteLocationsTo(&tree);
  if (!parser.ParseFromString(text, &config)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ":", errors.line_ + 1, ":", errors.column_ + 1, ": ", errors.message_,
        " (not a valid gpumem.v1.DaemonConfig textproto; schema: "
        "proto/gpumem/v1/config.proto)"));
  }
  const auto* d = v1::DaemonConfig::descriptor();
  auto at = [&](const char* field) {
    return Where(name, &tree, d->FindFieldByName(field));
  };

  if (!config.backend().empty() && config.backend() != "sim" &&
      config.backend() != "cuda") {
    return Bad(at("backend"), "backend",
               absl::StrCat("\"", config.backend(), "\" is not a backend (use sim or cuda)"));
  }
  if (config.socket().size() >= 108) {
    return Bad(at("socket"), "socket", "a Unix socket path is at most 107 bytes");
  }
  if (!config.sim_devices().empty()) {
    absl::StatusOr<std::vector<uint64_t>> sizes = ParseDeviceSizes(config.sim_devices());
    if (!sizes.ok()) return Bad(at("sim_devices"), "sim_devices", sizes.status().message());
  }
  // The topology names devices: it is checked here only against devices the
  // same file gives (--sim_devices may override them; the daemon checks the
  // pair it actually uses at start).
  if (!config.sim_topology().empty() && !config.sim_devices().empty()) {
    const uint32_t device_count = static_cast<uint32_t>(
        ParseDeviceSizes(config.sim_devices())->size());
    absl::StatusOr<std::vector<PeerLink>> links =
        ParseSimTopology(config.sim_topology(), device_count);
    if (!links.ok()) {
      return Bad(at("sim_topology"), "sim_topology", links.status().message());
    }
  }
  if (!config.admin_group().empty()) {
    struct group grp;
    struct group* found = nullptr;
    std::vector<char> buf(16384);
    getgrnam_r(config.admin_group().c_str(), &grp, buf.data(), buf.size(), &found);
    if (found == nullptr) {
      return Bad(at("admin_group"), "admin_group",
                 absl::StrCat("group \"", config.admin_group(),
                              "\" does not exist on this machine"));
    }
  }
  if (config.has_pool()) {
    const FieldDescriptor* pool_field = d->FindFieldByName("pool");
    const TextFormat::ParseInfoTree* pool_tree = tree.GetTreeForNested(pool_field, -1);
    const auto* p = v1::PoolConfig::descriptor();
    auto pool_at = [&](const char* field) {
      return Where(name, pool_tree, p->FindFieldByName(field));
    };
    const v1::PoolConfig& pool = config.pool();
    if (!pool.slab_size().empty()) {
      absl::StatusOr<uint64_t> slab = ParseByteSize(pool.slab_size());
      if (!slab.ok()) return Bad(pool_at("slab_size"), "pool.slab_size", slab.status().message());
      if (*slab == 0) return Bad(pool_at("slab_size"), "pool.slab_size", "must be > 0");
    }
    const double release = pool.empty_slab_release_seconds();
    if (!std::isfinite(release) || release < 0) {
      return Bad(pool_at("empty_slab_release_seconds"), "pool.empty_slab_release_seconds",
                 "must be a number of seconds >= 0 (0 means the default, 30)");
    }
  }
  return config;
}

absl::StatusOr<v1::DaemonConfig> LoadDaemonConfig(const std::string& path,
                                                  TextFormat::ParseInfoTree* locations) {
  if (path.empty()) return v1::DaemonConfig();
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read config ", path));
  std::stringstream text;
  text << in.rdbuf();
  return ParseDaemonConfig(path, text.str(), locations);
}

}  // namespace gpumem
