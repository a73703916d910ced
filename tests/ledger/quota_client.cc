// quota_client: a client process for the tenant, quota and waiting tests.
//
// Modes (one per run):
//   --race --size=B --iterations=N [--devices=0]
//       N times: Allocate B bytes (no mapping), Free it at once if granted.
//       Prints "done GRANTED REFUSED" (REFUSED: RESOURCE_EXHAUSTED), or
//       "error CODE MESSAGE" on any other status.
//   --size=B [--count=N] [--wait_ms=W] [--devices=0]
//       prints "waiting", then allocates N blocks (each with wait_ms W) and
//       prints "alloc ID" per block, then "ready", and holds them until
//       killed; or "error CODE MESSAGE".
//   --set_quota=TENANT --total=B   prints "status CODE" of SetQuota.
//   --ledger_status   prints GetStats' ledger as "ledger ENABLED FAILING
//       HELD PATH|ERROR" (0 or 1, a count, then the path and the error).
// Every line is flushed at once so the parent can follow along.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "client/lib/cpp/client.h"

ABSL_FLAG(std::string, socket, "", "daemon socket");
ABSL_FLAG(bool, race, false, "allocate and free in a loop");
ABSL_FLAG(uint64_t, size, 0, "bytes per block");
ABSL_FLAG(int, iterations, 100, "race: rounds");
ABSL_FLAG(int, count, 1, "blocks to hold");
ABSL_FLAG(uint32_t, wait_ms, 0, "AllocateRequest.wait_ms");
ABSL_FLAG(std::string, devices, "", "one selector");
ABSL_FLAG(std::string, set_quota, "", "tenant whose quota to set");
ABSL_FLAG(uint64_t, total, 0, "set_quota: total bytes");
ABSL_FLAG(bool, ledger_status, false, "print GetStats' ledger status");

namespace gpumem {
using client::Client;
namespace {

void Line(const std::string& s) {
  printf("%s\n", s.c_str());
  fflush(stdout);
}

std::string Error(const absl::Status& s) {
  return "error " + std::to_string(static_cast<int>(s.code())) + " " + std::string(s.message());
}

int Main() {
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(absl::GetFlag(FLAGS_socket));
  if (!client.ok()) {
    Line(Error(client.status()));
    return 1;
  }
  Client& c = **client;
  if (!absl::GetFlag(FLAGS_set_quota).empty()) {
    v1::SetQuotaRequest req;
    req.set_tenant(absl::GetFlag(FLAGS_set_quota));
    req.mutable_quota()->set_total_bytes(absl::GetFlag(FLAGS_total));
    Line("status " + std::to_string(static_cast<int>(c.SetQuota(req).status().code())));
    return 0;
  }
  if (absl::GetFlag(FLAGS_ledger_status)) {
    absl::StatusOr<v1::GetStatsResponse> stats = c.GetStats();
    if (!stats.ok()) {
      Line(Error(stats.status()));
      return 1;
    }
    const v1::LedgerStatus& l = stats->ledger();
    Line("ledger " + std::to_string(l.enabled()) + " " + std::to_string(l.failing()) + " " +
         std::to_string(l.held_events()) + " " + l.path() + "|" + l.last_error());
    return 0;
  }
  v1::AllocateRequest req;
  req.set_size_bytes(absl::GetFlag(FLAGS_size));
  if (!absl::GetFlag(FLAGS_devices).empty()) {
    req.mutable_placement()->add_devices(absl::GetFlag(FLAGS_devices));
  }
  if (absl::GetFlag(FLAGS_race)) {
    int granted = 0, refused = 0;
    for (int i = 0; i < absl::GetFlag(FLAGS_iterations); ++i) {
      absl::StatusOr<v1::AllocateResponse> r = c.AllocateRaw(req);
      if (r.ok()) {
        ++granted;
        for (const v1::Allocation& a : r->allocations()) {
          absl::Status s = c.Free(a.id());
          if (!s.ok()) {
            Line(Error(s));
            return 1;
          }
        }
      } else if (r.status().code() == absl::StatusCode::kResourceExhausted) {
        ++refused;
      } else {
        Line(Error(r.status()));
        return 1;
      }
    }
    Line("done " + std::to_string(granted) + " " + std::to_string(refused));
    return 0;
  }
  req.set_wait_ms(absl::GetFlag(FLAGS_wait_ms));
  Line("waiting");
  for (int i = 0; i < absl::GetFlag(FLAGS_count); ++i) {
    absl::StatusOr<v1::AllocateResponse> r = c.AllocateRaw(req);
    if (!r.ok()) {
      Line(Error(r.status()));
      return 1;
    }
    Line("alloc " + std::to_string(r->allocations(0).id()));
  }
  Line("ready");
  for (;;) pause();
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gpumem::Main();
}
