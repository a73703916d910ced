// Fuzzes the config text and the SIGHUP reload path (server/config): the
// input is a config file; it is parsed and validated (ParseDaemonConfig),
// resolved against no flags (ResolveSettings), and applied as a reload to
// a running core (ApplyReloadableConfig) whose config in force is a fixed
// one with tenants; then a request is served, and the fixed config is
// reloaded again.
//
// Checked for every input: a refused file is INVALID_ARGUMENT and names the
// file; a refused reload changes nothing (the tenant directory in force is
// the same object); an applied one leaves the quota book holding exactly
// each configured tenant's quota; the core keeps serving (an Allocate gets
// an answer, a Free of what it got works).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <google/protobuf/text_format.h>

#include "absl/strings/match.h"
#include "server/backend/sim_backend.h"
#include "server/config/daemon_config.h"
#include "server/config/reloadable.h"
#include "server/config/settings.h"
#include "server/core/memory_broker.h"
#include "server/quota/quota_book.h"
#include "server/tenants/tenant_directory.h"

namespace gpumem {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr char kName[] = "fuzz.textproto";

std::string StartConfig() {
  const std::string uid = std::to_string(getuid());
  return "tenant { name: \"mine\" uids: " + uid +
         " priority: 3 quota { total_bytes: \"48MiB\" device { device: \"0\" bytes: "
         "\"32MiB\" } max_allocations: 100 } max_waiting_requests: 4 max_sessions: 8 }\n"
         "tenant { name: \"other\" gids: 4242 quota { total_bytes: \"1GiB\" } }\n"
         "default_tenant: \"other\"\n";
}

struct World {
  SimBackend backend{std::vector<uint64_t>{64 * kMiB, 64 * kMiB}};
  tenants::TenantDirectoryHolder directory{tenants::TenantDirectory()};
  quota::QuotaBook quotas{2};
  std::unique_ptr<MemoryBroker> broker;
  ReloadTargets targets;
};

World* world = nullptr;

void Check(bool ok, const std::string& what) {
  if (!ok) {
    fprintf(stderr, "config_fuzzer: %s\n", what.c_str());
    abort();
  }
}

bool SameQuota(const tenants::Quota& a, const tenants::Quota& b) {
  if (a.total_bytes != b.total_bytes || a.max_allocations != b.max_allocations) return false;
  for (uint32_t d = 0; d < 2; ++d) {
    if (a.device_limit(d) != b.device_limit(d)) return false;
  }
  return true;
}

// Parse, resolve and apply `text` as a reload; whether it was applied.
bool Reload(const std::string& text) {
  google::protobuf::TextFormat::ParseInfoTree where;
  absl::StatusOr<v1::DaemonConfig> file = ParseDaemonConfig(kName, text, &where);
  if (!file.ok()) {
    Check(file.status().code() == absl::StatusCode::kInvalidArgument,
          "parse error code: " + file.status().ToString());
    Check(absl::StartsWith(file.status().message(), kName),
          "parse error does not name the file: " + file.status().ToString());
    return false;
  }
  absl::StatusOr<Settings> settings = ResolveSettings(CommandLine{}, kName, *file);
  if (!settings.ok()) {
    Check(settings.status().code() == absl::StatusCode::kInvalidArgument,
          "settings error code: " + settings.status().ToString());
    return false;
  }
  (void)RestartOnlyChanges(*settings, *settings);
  const std::shared_ptr<const tenants::TenantDirectory> before = world->directory.Get();
  absl::StatusOr<ReloadOutcome> applied =
      ApplyReloadableConfig(*settings, &where, world->targets, /*at_start=*/false);
  const std::shared_ptr<const tenants::TenantDirectory> after = world->directory.Get();
  if (!applied.ok()) {
    Check(after == before, "a refused reload changed the tenant directory");
    return false;
  }
  (void)DescribeTenantChange(*before, *after);
  for (const tenants::Tenant& t : after->tenants()) {
    Check(SameQuota(world->quotas.GetQuota(t.id), t.quota),
          "quota book differs from the config for tenant " + t.name);
  }
  return true;
}

}  // namespace
}  // namespace gpumem

using namespace gpumem;  // NOLINT: the fuzzer entry points are global

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  world = new World;
  BrokerOptions o;
  o.pool.slab_size = 4 * kMiB;
  o.pool.granularity = 4096;
  o.tenants = &world->directory;
  o.quotas = &world->quotas;
  world->broker = std::make_unique<MemoryBroker>(&world->backend, o);
  world->targets = ReloadTargets{world->broker.get(), &world->broker->devices(),
                                 &world->directory, &world->quotas, nullptr};
  google::protobuf::TextFormat::ParseInfoTree where;
  absl::StatusOr<v1::DaemonConfig> file = ParseDaemonConfig(kName, StartConfig(), &where);
  Check(file.ok(), "start config");
  absl::StatusOr<Settings> settings = ResolveSettings(CommandLine{}, kName, *file);
  Check(settings.ok(), "start settings");
  Check(ApplyReloadableConfig(*settings, &where, world->targets, /*at_start=*/true).ok(),
        "start apply");
  Check(world->broker->Start().ok(), "broker start");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 16384) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  Reload(text);
  // The core keeps serving under whatever was applied.
  const PeerCred self{getpid(), getuid(), getgid()};
  v1::AllocateRequest r;
  r.set_size_bytes(kMiB);
  MemoryBroker::AllocateOutcome o = world->broker->Allocate(self, r, nullptr);
  Check(o.kind == MemoryBroker::AllocateOutcome::Kind::kAnswered, "no answer");
  if (o.answer.ok()) {
    v1::FreeRequest f;
    f.set_id(o.answer->allocations(0).id());
    Check(world->broker->Free(self, f).ok(), "free of a fresh allocation");
  }
  Check(Reload(StartConfig()), "the start config no longer reloads");
  return 0;
}
