// Environment variables and placement text of the client library.
#include "client/lib/env_config.h"

#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/byte_size.h"

namespace gpumem {
namespace client {
namespace {

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

absl::Status ReadBytes(const char* name, uint64_t* out) {
  const char* v = Env(name);
  if (v == nullptr) return absl::OkStatus();
  absl::StatusOr<uint64_t> b = ParseByteSize(v);
  if (!b.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(name, "=\"", v, "\": ", b.status().message()));
  }
  *out = *b;
  return absl::OkStatus();
}

absl::Status ReadMs(const char* name, int64_t* out) {
  const char* v = Env(name);
  if (v == nullptr) return absl::OkStatus();
  int64_t ms;
  if (!absl::SimpleAtoi(v, &ms) || ms < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, "=\"", v, "\": want a whole number of milliseconds >= 0"));
  }
  *out = ms;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PoolOptions> PoolOptionsFromEnv(absl::string_view socket_path) {
  PoolOptions o;
  o.socket_path = std::string(socket_path);
  if (o.socket_path.empty()) o.socket_path = DefaultSocketPath();
  absl::Status s = ReadBytes("GPUMEM_LEASE_SIZE", &o.lease_bytes);
  if (s.ok()) s = ReadBytes("GPUMEM_CACHE_MAX", &o.cache_max_request);
  if (s.ok()) s = ReadMs("GPUMEM_IDLE_RELEASE_MS", &o.idle_release_ms);
  // The client library reads it itself (Client::Connect); a bad value is
  // refused here, at connect, like the others.
  int64_t reconnect_ms = 0;
  if (s.ok()) s = ReadMs("GPUMEM_RECONNECT_MS", &reconnect_ms);
  if (!s.ok()) return s;
  return o;
}

absl::StatusOr<v1::PlacementRequest> ParsePlacementText(absl::string_view text) {
  PlacementFlags flags;
  for (absl::string_view tok : absl::StrSplit(text, absl::ByAnyChar(" \t\n"), absl::SkipEmpty())) {
    absl::string_view t = tok;
    absl::ConsumePrefix(&t, "--");
    const size_t eq = t.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "placement \"", text, "\": \"", tok,
          "\" is not NAME=VALUE (names: gpus, exclude, fallback, policy)"));
    }
    absl::string_view name = t.substr(0, eq), value = t.substr(eq + 1);
    if (name == "gpus") {
      flags.gpus = std::string(value);
    } else if (name == "exclude") {
      flags.exclude = std::string(value);
    } else if (name == "fallback") {
      flags.fallback.push_back(std::string(value));
    } else if (name == "policy") {
      flags.policy = std::string(value);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "placement \"", text, "\": unknown flag \"", name,
          "\" (names: gpus, exclude, fallback, policy)"));
    }
  }
  return BuildPlacementRequest(flags);
}

absl::StatusOr<v1::PlacementRequest> PlacementFromEnv() {
  const char* v = Env("GPUMEM_PLACEMENT");
  if (v == nullptr) return v1::PlacementRequest();
  absl::StatusOr<v1::PlacementRequest> p = ParsePlacementText(v);
  if (!p.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("GPUMEM_PLACEMENT: ", p.status().message()));
  }
  return p;
}

}  // namespace client
}  // namespace gpumem
