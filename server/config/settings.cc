// See settings.h. Each setting: the flag if given, else the file's field if
// set, else the member's initializer; then parsed and range-checked, with
// the flag's name in the message when the value came from a flag.
#include "server/config/settings.h"

#include <algorithm>

#include "absl/numeric/bits.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/byte_size.h"
#include "server/backend/sim_topology.h"
#include "server/tenants/socket_path.h"

namespace gpumem {
namespace {

// `flag` over `file` (unset when empty / not positive) over the default.
template <typename T>
void Pick(Setting<T>* s, const std::optional<T>& flag, const std::optional<T>& file) {
  if (flag.has_value()) {
    *s = {*flag, Source::kFlag};
  } else if (file.has_value()) {
    *s = {*file, Source::kConfig};
  }
}

std::optional<std::string> NonEmpty(const std::string& v) {
  if (v.empty()) return std::nullopt;
  return v;
}

// "--name" for a flag, "the config's <field>" for the file.
std::string Where(Source source, const char* flag, const char* field) {
  return source == Source::kFlag ? absl::StrCat("--", flag)
                                 : absl::StrCat("config field ", field);
}

absl::Status Bad(Source source, const char* flag, const char* field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(Where(source, flag, field), ": ", why));
}

}  // namespace

const char* SourceName(Source source) {
  switch (source) {
    case Source::kDefault: return "default";
    case Source::kConfig: return "config";
    case Source::kFlag: return "flag";
  }
  return "default";
}

absl::StatusOr<Settings> ResolveSettings(const CommandLine& flags, const std::string& path,
                                         const v1::DaemonConfig& file) {
  Settings s;
  s.config_path = path;
  s.file = file;

  Pick(&s.backend, flags.backend, NonEmpty(file.backend()));
  if (s.backend.value != "sim" && s.backend.value != "cuda") {
    return Bad(s.backend.source, "backend", "backend",
               absl::StrCat("unknown backend \"", s.backend.value, "\" (use sim or cuda)"));
  }

  Pick(&s.sim_devices, flags.sim_devices, NonEmpty(file.sim_devices()));
  Pick(&s.sim_topology, flags.sim_topology, NonEmpty(file.sim_topology()));
  if (s.backend.value == "sim") {
    absl::StatusOr<std::vector<uint64_t>> sizes = ParseDeviceSizes(s.sim_devices.value);
    if (!sizes.ok()) {
      return Bad(s.sim_devices.source, "sim_devices", "sim_devices", sizes.status().message());
    }
    s.sim_device_sizes = *sizes;
    absl::StatusOr<std::vector<PeerLink>> links =
        ParseSimTopology(s.sim_topology.value, static_cast<uint32_t>(sizes->size()));
    if (!links.ok()) {
      return Bad(s.sim_topology.source, "sim_topology", "sim_topology", links.status().message());
    }
    s.sim_links = *links;
  }
  if (flags.sim_slab_create_delay.has_value()) {
    for (absl::string_view item :
         absl::StrSplit(*flags.sim_slab_create_delay, ',', absl::SkipEmpty())) {
      std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits(':', 1));
      uint32_t device = 0;
      absl::Duration delay;
      if (!absl::SimpleAtoi(kv.first, &device) || device >= s.sim_device_sizes.size() ||
          !absl::ParseDuration(kv.second, &delay) || delay < absl::ZeroDuration()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--sim_slab_create_delay: bad entry \"", item,
            "\" (want DEVICE:DURATION with a device below ", s.sim_device_sizes.size(),
            ", e.g. 0:300ms)"));
      }
      s.sim_slab_create_delays.emplace_back(device, delay);
    }
  }

  Pick(&s.socket, flags.socket, NonEmpty(file.socket()));
  Pick(&s.tenant_socket_dir, flags.tenant_socket_dir, NonEmpty(file.tenant_socket_dir()));
  if (absl::Status dir = tenants::CheckSocketDir(s.tenant_socket_dir.value); !dir.ok()) {
    return Bad(s.tenant_socket_dir.source, "tenant_socket_dir", "tenant_socket_dir",
               "must be an absolute path without '.', '..', '//' or a trailing '/'");
  }

  std::optional<std::string> slab_text = flags.slab_size;
  if (!slab_text.has_value()) slab_text = NonEmpty(file.pool().slab_size());
  if (slab_text.has_value()) {
    const Source from = flags.slab_size.has_value() ? Source::kFlag : Source::kConfig;
    absl::StatusOr<uint64_t> slab = ParseByteSize(*slab_text);
    if (!slab.ok()) return Bad(from, "slab_size", "pool.slab_size", slab.status().message());
    if (*slab == 0) return Bad(from, "slab_size", "pool.slab_size", "must be > 0");
    s.slab_size = {*slab, from};
  }
  // A byte size of the pool section: the flag, else the file's field.
  auto pool_bytes = [&](Setting<uint64_t>* out, const std::optional<std::string>& flag,
                        const std::string& field_text, const char* flag_name,
                        const char* field) -> absl::Status {
    std::optional<std::string> text = flag;
    if (!text.has_value()) text = NonEmpty(field_text);
    if (!text.has_value()) return absl::OkStatus();
    const Source from = flag.has_value() ? Source::kFlag : Source::kConfig;
    absl::StatusOr<uint64_t> bytes = ParseByteSize(*text);
    if (!bytes.ok()) return Bad(from, flag_name, field, bytes.status().message());
    if (*bytes == 0) return Bad(from, flag_name, field, "must be > 0");
    *out = {*bytes, from};
    return absl::OkStatus();
  };
  if (absl::Status st = pool_bytes(&s.min_slab_size, flags.min_slab_size,
                                   file.pool().min_slab_size(), "min_slab_size",
                                   "pool.min_slab_size");
      !st.ok()) {
    return st;
  }
  if (absl::Status st = pool_bytes(&s.max_alignment, flags.max_alignment,
                                   file.pool().max_alignment(), "max_alignment",
                                   "pool.max_alignment");
      !st.ok()) {
    return st;
  }
  if (!absl::has_single_bit(s.max_alignment.value)) {
    return Bad(s.max_alignment.source, "max_alignment", "pool.max_alignment",
               "must be a power of two");
  }

  Pick(&s.reserve_fraction, flags.reserve_fraction, std::optional<double>());
  if (!(s.reserve_fraction.value >= 0 && s.reserve_fraction.value <= 1)) {
    return absl::InvalidArgumentError("--reserve_fraction must be in [0, 1]");
  }

  std::vector<std::string> kind_names(file.handle_kinds().begin(), file.handle_kinds().end());
  Source kinds_from = kind_names.empty() ? Source::kDefault : Source::kConfig;
  if (flags.handle_kinds.has_value()) {
    kind_names = absl::StrSplit(*flags.handle_kinds, ',', absl::SkipEmpty());
    kinds_from = Source::kFlag;
  }
  s.handle_kinds.source = kinds_from;
  for (const std::string& name : kind_names) {
    absl::StatusOr<HandleKind> kind = ParseHandleKind(name);
    if (!kind.ok()) return Bad(kinds_from, "handle_kinds", "handle_kinds", kind.status().message());
    s.handle_kinds.value.push_back(*kind);
  }

  Pick(&s.ledger, flags.ledger, NonEmpty(file.ledger()));
  Pick(&s.state, flags.state, NonEmpty(file.state()));
  if (s.state.value.empty()) s.state.value = absl::StrCat(s.socket.value, ".state");
  if (s.state.value != "none" && s.state.value[0] != '/') {
    return Bad(s.state.source, "state", "state", "must be an absolute path or none");
  }
  std::optional<double> grace_file;
  if (file.restore_grace_seconds() > 0) grace_file = file.restore_grace_seconds();
  const std::optional<double> grace =
      flags.restore_grace_seconds.has_value() ? flags.restore_grace_seconds : grace_file;
  if (grace.has_value()) {
    const Source from = flags.restore_grace_seconds.has_value() ? Source::kFlag : Source::kConfig;
    if (!(*grace >= 0 && *grace <= 86400)) {
      return Bad(from, "restore_grace_seconds", "restore_grace_seconds",
                 "must be in [0, 86400]");
    }
    s.restore_grace = {absl::Seconds(*grace), from};
  }
  Pick(&s.ledger_max_pages, flags.ledger_max_pages, std::optional<int64_t>());
  if (s.ledger_max_pages.value < 0) {
    return absl::InvalidArgumentError("--ledger_max_pages must be >= 0");
  }
  {
    std::optional<int64_t> retain_file;
    if (file.ledger_retain_events() != 0) {
      retain_file = file.ledger_retain_events() < 0 ? 0 : file.ledger_retain_events();
    }
    Pick(&s.ledger_retain_events, flags.ledger_retain_events, retain_file);
    const int64_t v = s.ledger_retain_events.value;
    if (v != 0 && (v < 10000 || v > 1'000'000'000'000)) {
      return Bad(s.ledger_retain_events.source, "ledger_retain_events", "ledger_retain_events",
                 "must be 0 (keep every event) or in [10000, 1000000000000]");
    }
  }
  Pick(&s.metrics_listen, flags.metrics_listen, std::optional<std::string>());

  Pick(&s.drain_seconds, flags.drain_seconds, std::optional<double>());
  if (!(s.drain_seconds.value >= 0)) {
    return absl::InvalidArgumentError("--drain_seconds must be >= 0");
  }
  Pick(&s.queue_threads, flags.stream_threads, std::optional<int>());
  if (s.queue_threads.value < 1 || s.queue_threads.value > 64) {
    return absl::InvalidArgumentError("--stream_threads must be in [1, 64]");
  }
  Pick(&s.backend_threads, flags.stream_backend_threads, std::optional<int>());
  if (s.backend_threads.value < 1 || s.backend_threads.value > 64) {
    return absl::InvalidArgumentError("--stream_backend_threads must be in [1, 64]");
  }
  Pick(&s.query_threads, flags.query_threads, std::optional<int>());
  if (s.query_threads.value < 1 || s.query_threads.value > 64) {
    return absl::InvalidArgumentError("--query_threads must be in [1, 64]");
  }

  std::optional<double> release_flag = flags.empty_slab_release_seconds;
  if (release_flag.has_value() && !(*release_flag >= 0)) {
    return absl::InvalidArgumentError("--empty_slab_release_seconds must be >= 0");
  }
  std::optional<double> release_file;
  if (file.pool().empty_slab_release_seconds() > 0) {
    release_file = file.pool().empty_slab_release_seconds();
  }
  if (release_flag.has_value()) {
    s.empty_slab_release = {absl::Seconds(*release_flag), Source::kFlag};
  } else if (release_file.has_value()) {
    s.empty_slab_release = {absl::Seconds(*release_file), Source::kConfig};
  }
  Pick(&s.admin_group, flags.admin_group, NonEmpty(file.admin_group()));

  // Milliseconds settings: the flag (range-checked), else the file's field
  // when not 0, else the default.
  auto millis = [](Setting<absl::Duration>* s, const std::optional<int>& flag, uint32_t file,
                   const char* name, const char* field, int min,
                   int max) -> absl::Status {
    if (flag.has_value()) {
      if (*flag < min || *flag > max) {
        return Bad(Source::kFlag, name, field,
                   absl::StrCat("must be in [", min, ", ", max, "] milliseconds"));
      }
      *s = {absl::Milliseconds(*flag), Source::kFlag};
    } else if (file != 0) {
      if (file > static_cast<uint32_t>(max)) {
        return Bad(Source::kConfig, name, field,
                   absl::StrCat("must be at most ", max, " milliseconds"));
      }
      *s = {absl::Milliseconds(file), Source::kConfig};
    }
    return absl::OkStatus();
  };
  if (!flags.reclaim_wait_ms.has_value() && file.reclaim_wait_ms() < 0) {
    s.reclaim_wait = {absl::ZeroDuration(), Source::kConfig};  // off
  } else if (absl::Status r = millis(&s.reclaim_wait, flags.reclaim_wait_ms,
                                     static_cast<uint32_t>(std::max(0, file.reclaim_wait_ms())),
                                     "reclaim_wait_ms", "reclaim_wait_ms", 0, 10000);
             !r.ok()) {
    return r;
  }
  if (absl::Status r = millis(&s.wait_reserve, flags.wait_reserve_ms, file.wait_reserve_ms(),
                              "wait_reserve_ms", "wait_reserve_ms", 1, 600000);
      !r.ok()) {
    return r;
  }
  if (flags.wait_bypass_limit.has_value()) {
    if (*flags.wait_bypass_limit < 1 || *flags.wait_bypass_limit > 1000000) {
      return Bad(Source::kFlag, "wait_bypass_limit", "wait_bypass_limit",
                 "must be in [1, 1000000]");
    }
    s.wait_bypass_limit = {static_cast<uint32_t>(*flags.wait_bypass_limit), Source::kFlag};
  } else if (file.wait_bypass_limit() != 0) {
    if (file.wait_bypass_limit() > 1000000) {
      return Bad(Source::kConfig, "wait_bypass_limit", "wait_bypass_limit",
                 "must be at most 1000000");
    }
    s.wait_bypass_limit = {file.wait_bypass_limit(), Source::kConfig};
  }
  // Bounded waiters: at most a day of waiting (the default a minute), and a
  // byte size for the bytes a tenant's waiters hold ("0": no limit).
  if (flags.max_wait_ms.has_value()) {
    if (*flags.max_wait_ms < 1 || *flags.max_wait_ms > 86400000) {
      return Bad(Source::kFlag, "max_wait_ms", "max_wait_ms", "must be in [1, 86400000]");
    }
    s.max_wait = {absl::Milliseconds(*flags.max_wait_ms), Source::kFlag};
  } else if (file.max_wait_ms() != 0) {
    if (file.max_wait_ms() > 86400000) {
      return Bad(Source::kConfig, "max_wait_ms", "max_wait_ms", "must be at most 86400000");
    }
    s.max_wait = {absl::Milliseconds(file.max_wait_ms()), Source::kConfig};
  }
  {
    std::optional<std::string> text = flags.max_waiting_bytes_per_tenant;
    if (!text.has_value()) text = NonEmpty(file.max_waiting_bytes_per_tenant());
    if (text.has_value()) {
      const Source from =
          flags.max_waiting_bytes_per_tenant.has_value() ? Source::kFlag : Source::kConfig;
      absl::StatusOr<uint64_t> v = ParseByteSize(*text);
      if (!v.ok()) {
        return Bad(from, "max_waiting_bytes_per_tenant", "max_waiting_bytes_per_tenant",
                   v.status().message());
      }
      s.max_waiting_bytes_per_tenant = {*v, from};
    }
  }

  // Connection limits: the flag (range-checked), else the file's field when
  // not 0, else the default.
  auto count = [](Setting<uint32_t>* s, const std::optional<int>& flag, uint32_t file,
                  const char* name, uint32_t min, uint32_t max) -> absl::Status {
    if (flag.has_value()) {
      if (*flag < static_cast<int64_t>(min) || *flag > static_cast<int64_t>(max)) {
        return Bad(Source::kFlag, name, name, absl::StrCat("must be in [", min, ", ", max, "]"));
      }
      *s = {static_cast<uint32_t>(*flag), Source::kFlag};
    } else if (file != 0) {
      if (file < min || file > max) {
        return Bad(Source::kConfig, name, name, absl::StrCat("must be in [", min, ", ", max, "]"));
      }
      *s = {file, Source::kConfig};
    }
    return absl::OkStatus();
  };
  if (absl::Status r = count(&s.max_connections_per_uid, flags.max_connections_per_uid,
                             file.max_connections_per_uid(), "max_connections_per_uid", 1,
                             1000000);
      !r.ok()) {
    return r;
  }
  if (absl::Status r = count(&s.max_connections_per_tenant_socket,
                             flags.max_connections_per_tenant_socket,
                             file.max_connections_per_tenant_socket(),
                             "max_connections_per_tenant_socket", 1, 1000000);
      !r.ok()) {
    return r;
  }
  if (absl::Status r = count(&s.fd_reserve, flags.fd_reserve, file.fd_reserve(), "fd_reserve",
                             16, 1000000);
      !r.ok()) {
    return r;
  }
  if (absl::Status r = count(&s.max_concurrent_streams, flags.max_concurrent_streams,
                             file.max_concurrent_streams(), "max_concurrent_streams", 1, 100000);
      !r.ok()) {
    return r;
  }
  if (absl::Status r = count(&s.max_reflection_streams_per_uid,
                             flags.max_reflection_streams_per_uid,
                             file.max_reflection_streams_per_uid(),
                             "max_reflection_streams_per_uid", 1, 1000);
      !r.ok()) {
    return r;
  }
  auto bytes = [](Setting<uint64_t>* s, const std::optional<std::string>& flag,
                  const std::string& file, const char* name, uint64_t min,
                  uint64_t max) -> absl::Status {
    std::optional<std::string> text = flag.has_value() ? flag : NonEmpty(file);
    if (!text.has_value()) return absl::OkStatus();
    const Source from = flag.has_value() ? Source::kFlag : Source::kConfig;
    absl::StatusOr<uint64_t> v = ParseByteSize(*text);
    if (!v.ok()) return Bad(from, name, name, v.status().message());
    if (*v < min || *v > max) {
      return Bad(from, name, name,
                 absl::StrCat("must be in [", FormatBytes(min), ", ", FormatBytes(max), "]"));
    }
    *s = {*v, from};
    return absl::OkStatus();
  };
  if (absl::Status r = bytes(&s.max_receive_message_size, flags.max_receive_message_size,
                             file.max_receive_message_size(), "max_receive_message_size",
                             uint64_t{4} << 10, uint64_t{1} << 30);
      !r.ok()) {
    return r;
  }
  if (absl::Status r = bytes(&s.grpc_memory_limit, flags.grpc_memory_limit,
                             file.grpc_memory_limit(), "grpc_memory_limit", uint64_t{16} << 20,
                             uint64_t{1} << 40);
      !r.ok()) {
    return r;
  }
  return s;
}

std::string DefaultsText() {
  const Settings d;
  return absl::StrCat(
      "--backend=", d.backend.value, " --sim_devices=", d.sim_devices.value,
      " --socket=", d.socket.value, " --tenant_socket_dir=", d.tenant_socket_dir.value,
      " --slab_size=", d.slab_size.value % (uint64_t{1} << 30) == 0
                           ? absl::StrCat(d.slab_size.value >> 30, "GiB")
                           : absl::StrCat(d.slab_size.value),
      " --min_slab_size=", d.min_slab_size.value >> 20, "MiB",
      " --max_alignment=", d.max_alignment.value >> 20, "MiB",
      " --empty_slab_release_seconds=", absl::ToDoubleSeconds(d.empty_slab_release.value),
      " --reserve_fraction=", d.reserve_fraction.value, " --drain_seconds=",
      d.drain_seconds.value, " --ledger=", d.ledger.value,
      " --ledger_retain_events=", d.ledger_retain_events.value,
      " --state=<the socket's path>.state --restore_grace_seconds=",
      absl::ToDoubleSeconds(d.restore_grace.value),
      " --stream_threads=", d.queue_threads.value,
      " --stream_backend_threads=", d.backend_threads.value,
      " --query_threads=", d.query_threads.value,
      " --reclaim_wait_ms=", absl::ToInt64Milliseconds(d.reclaim_wait.value),
      " --wait_bypass_limit=", d.wait_bypass_limit.value,
      " --wait_reserve_ms=", absl::ToInt64Milliseconds(d.wait_reserve.value),
      " --max_wait_ms=", absl::ToInt64Milliseconds(d.max_wait.value),
      " --max_waiting_bytes_per_tenant=", d.max_waiting_bytes_per_tenant.value >> 20, "MiB",
      " --max_connections_per_uid=", d.max_connections_per_uid.value,
      " --max_connections_per_tenant_socket=", d.max_connections_per_tenant_socket.value,
      " --fd_reserve=", d.fd_reserve.value,
      " --max_concurrent_streams=", d.max_concurrent_streams.value,
      " --max_receive_message_size=", d.max_receive_message_size.value >> 20, "MiB",
      " --grpc_memory_limit=", d.grpc_memory_limit.value >> 20, "MiB",
      " --max_reflection_streams_per_uid=", d.max_reflection_streams_per_uid.value,
      " (--admin_group: root only; --handle_kinds: every kind the backend makes; "
      "--metrics_listen: off)");
}

}  // namespace gpumem
