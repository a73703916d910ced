// See settings.h. Each row: the flag if given, else the file's field if set
// (by its kind's convention, setting_row.h), else the default it holds;
// then its rule, then its Finish. The kinds' code is here once; the Finish
// functions are the only per-setting code.
#include "server/config/settings.h"

#include <algorithm>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/text_format.h>

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

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// "--name" for a flag, "config field <field>" for the file.
std::string Where(const SettingRow& row, Source source) {
  return source == Source::kFlag ? absl::StrCat("--", row.flag)
                                 : absl::StrCat("config field ", row.field);
}

absl::Status Bad(const SettingRow& row, Source source, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(Where(row, source), ": ", why));
}

// The field at `path` ("pool.slab_size") and the message holding it; null
// when the row has no field.
struct FileField {
  const Message* holder = nullptr;
  const FieldDescriptor* field = nullptr;
};

FileField Find(const v1::DaemonConfig& file, const char* path) {
  if (path == nullptr) return {};
  const Message* holder = &file;
  const FieldDescriptor* field = nullptr;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    if (field != nullptr) {
      if (field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) return {};
      holder = &holder->GetReflection()->GetMessage(*holder, field);
    }
    field = holder->GetDescriptor()->FindFieldByName(std::string(part));
    if (field == nullptr) return {};
  }
  return {holder, field};
}

std::optional<std::string> FileText(const v1::DaemonConfig& file, const SettingRow& row) {
  const FileField f = Find(file, row.field);
  if (f.field == nullptr || f.field->cpp_type() != FieldDescriptor::CPPTYPE_STRING) {
    return std::nullopt;
  }
  std::string text = f.holder->GetReflection()->GetString(*f.holder, f.field);
  if (text.empty()) return std::nullopt;
  return text;
}

std::optional<int64_t> FileInteger(const v1::DaemonConfig& file, const SettingRow& row) {
  const FileField f = Find(file, row.field);
  if (f.field == nullptr) return std::nullopt;
  const auto* r = f.holder->GetReflection();
  int64_t v = 0;
  switch (f.field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: v = r->GetInt32(*f.holder, f.field); break;
    case FieldDescriptor::CPPTYPE_INT64: v = r->GetInt64(*f.holder, f.field); break;
    case FieldDescriptor::CPPTYPE_UINT32: v = r->GetUInt32(*f.holder, f.field); break;
    default: return std::nullopt;
  }
  if (v == 0) return std::nullopt;
  return std::max<int64_t>(v, 0);
}

std::optional<double> FileSeconds(const v1::DaemonConfig& file, const SettingRow& row) {
  const FileField f = Find(file, row.field);
  if (f.field == nullptr || f.field->cpp_type() != FieldDescriptor::CPPTYPE_DOUBLE) {
    return std::nullopt;
  }
  const double v = f.holder->GetReflection()->GetDouble(*f.holder, f.field);
  if (!(v > 0)) return std::nullopt;
  return v;
}

std::vector<std::string> FileTexts(const v1::DaemonConfig& file, const SettingRow& row) {
  const FileField f = Find(file, row.field);
  if (f.field == nullptr || !f.field->is_repeated() ||
      f.field->cpp_type() != FieldDescriptor::CPPTYPE_STRING) {
    return {};
  }
  const auto* r = f.holder->GetReflection();
  std::vector<std::string> texts;
  for (int i = 0; i < r->FieldSize(*f.holder, f.field); ++i) {
    texts.push_back(r->GetRepeatedString(*f.holder, f.field, i));
  }
  return texts;
}

// The field as written (every element of a repeated one), for comparing
// two files.
std::string FileFieldText(const v1::DaemonConfig& file, const SettingRow& row) {
  const FileField f = Find(file, row.field);
  if (f.field == nullptr) return "";
  std::string out;
  const int count =
      f.field->is_repeated() ? f.holder->GetReflection()->FieldSize(*f.holder, f.field) : 1;
  for (int i = 0; i < count; ++i) {
    std::string one;
    google::protobuf::TextFormat::PrintFieldValueToString(
        *f.holder, f.field, f.field->is_repeated() ? i : -1, &one);
    absl::StrAppend(&out, one, "\n");
  }
  return out;
}

// A number against the row's bounds (setting_row.h: Rule).
template <typename T>
absl::Status CheckNumber(const SettingRow& row, Source from, T v) {
  const Rule& r = row.rule;
  const std::string range = absl::StrCat("[", r.min, ", ", r.max, "]", r.unit);
  switch (r.bound) {
    case Rule::Bound::kNone:
      return absl::OkStatus();
    case Rule::Bound::kPositive:
      if (v > 0) return absl::OkStatus();
      return Bad(row, from, "must be > 0");
    case Rule::Bound::kAtLeast:
      if (v >= r.min) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat("--", row.flag, " must be >= ", r.min));
    case Rule::Bound::kIn:
      if (v >= r.min && v <= r.max) return absl::OkStatus();
      if (row.field == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("--", row.flag, " must be in ", range));
      }
      return Bad(row, from, absl::StrCat("must be in ", range));
    case Rule::Bound::kUpTo:
      if (from == Source::kConfig && !(v <= r.max)) {
        return Bad(row, from, absl::StrCat("must be at most ", r.max, r.unit));
      }
      if (v >= r.min && v <= r.max) return absl::OkStatus();
      return Bad(row, from, absl::StrCat("must be in ", range));
  }
  return absl::OkStatus();
}

absl::Status CheckBytes(const SettingRow& row, Source from, uint64_t v) {
  const Rule& r = row.rule;
  if (r.bound == Rule::Bound::kIn) {
    const uint64_t min = static_cast<uint64_t>(r.min);
    const uint64_t max = static_cast<uint64_t>(r.max);
    if (v >= min && v <= max) return absl::OkStatus();
    return Bad(row, from,
               absl::StrCat("must be in [", FormatBytes(min), ", ", FormatBytes(max), "]"));
  }
  return CheckNumber<uint64_t>(row, from, v);
}

// Picks (and checks) one setting of each kind: the flag, else the file,
// else it keeps the default.
absl::Status Pick(setting_kind::Text, const SettingRow& row, const std::optional<std::string>& flag,
                  const v1::DaemonConfig& file, Setting<std::string>* out) {
  if (flag.has_value()) {
    *out = {*flag, Source::kFlag};
  } else if (std::optional<std::string> text = FileText(file, row); text.has_value()) {
    *out = {*text, Source::kConfig};
  }
  return absl::OkStatus();
}

absl::Status Pick(setting_kind::Bytes, const SettingRow& row,
                  const std::optional<std::string>& flag, const v1::DaemonConfig& file,
                  Setting<uint64_t>* out) {
  std::optional<std::string> text = flag;
  if (!text.has_value()) text = FileText(file, row);
  if (!text.has_value()) return absl::OkStatus();
  const Source from = flag.has_value() ? Source::kFlag : Source::kConfig;
  absl::StatusOr<uint64_t> bytes = ParseByteSize(*text);
  if (!bytes.ok()) return Bad(row, from, bytes.status().message());
  if (absl::Status st = CheckBytes(row, from, *bytes); !st.ok()) return st;
  *out = {*bytes, from};
  return absl::OkStatus();
}

// The integer the flag or the file gives, checked, and where it came from.
template <typename F>
absl::StatusOr<std::optional<std::pair<int64_t, Source>>> PickInteger(
    const SettingRow& row, const std::optional<F>& flag, const v1::DaemonConfig& file) {
  std::optional<std::pair<int64_t, Source>> picked;
  if (flag.has_value()) {
    picked = {static_cast<int64_t>(*flag), Source::kFlag};
  } else if (std::optional<int64_t> v = FileInteger(file, row); v.has_value()) {
    picked = {*v, Source::kConfig};
  }
  if (picked.has_value()) {
    if (absl::Status st = CheckNumber(row, picked->second, picked->first); !st.ok()) return st;
  }
  return picked;
}

template <typename V, typename F>
absl::Status Pick(setting_kind::Integer<V, F>, const SettingRow& row,
                  const std::optional<F>& flag, const v1::DaemonConfig& file, Setting<V>* out) {
  absl::StatusOr<std::optional<std::pair<int64_t, Source>>> picked =
      PickInteger(row, flag, file);
  if (!picked.ok()) return picked.status();
  if (picked->has_value()) *out = {static_cast<V>((*picked)->first), (*picked)->second};
  return absl::OkStatus();
}

template <typename F>
absl::Status Pick(setting_kind::Millis<F>, const SettingRow& row, const std::optional<F>& flag,
                  const v1::DaemonConfig& file, Setting<absl::Duration>* out) {
  absl::StatusOr<std::optional<std::pair<int64_t, Source>>> picked =
      PickInteger(row, flag, file);
  if (!picked.ok()) return picked.status();
  if (picked->has_value()) {
    *out = {absl::Milliseconds((*picked)->first), (*picked)->second};
  }
  return absl::OkStatus();
}

// The double the flag or the file gives, checked, and where it came from.
absl::StatusOr<std::optional<std::pair<double, Source>>> PickDouble(
    const SettingRow& row, const std::optional<double>& flag, const v1::DaemonConfig& file) {
  std::optional<std::pair<double, Source>> picked;
  if (flag.has_value()) {
    picked = {*flag, Source::kFlag};
  } else if (std::optional<double> v = FileSeconds(file, row); v.has_value()) {
    picked = {*v, Source::kConfig};
  }
  if (picked.has_value()) {
    if (absl::Status st = CheckNumber(row, picked->second, picked->first); !st.ok()) return st;
  }
  return picked;
}

absl::Status Pick(setting_kind::Seconds, const SettingRow& row,
                  const std::optional<double>& flag, const v1::DaemonConfig& file,
                  Setting<absl::Duration>* out) {
  absl::StatusOr<std::optional<std::pair<double, Source>>> picked = PickDouble(row, flag, file);
  if (!picked.ok()) return picked.status();
  if (picked->has_value()) *out = {absl::Seconds((*picked)->first), (*picked)->second};
  return absl::OkStatus();
}

absl::Status Pick(setting_kind::Number, const SettingRow& row,
                  const std::optional<double>& flag, const v1::DaemonConfig& file,
                  Setting<double>* out) {
  absl::StatusOr<std::optional<std::pair<double, Source>>> picked = PickDouble(row, flag, file);
  if (!picked.ok()) return picked.status();
  if (picked->has_value()) *out = {(*picked)->first, (*picked)->second};
  return absl::OkStatus();
}

absl::Status Pick(setting_kind::Bool, const SettingRow&, const std::optional<bool>& flag,
                  const v1::DaemonConfig&, Setting<bool>* out) {
  if (flag.has_value()) *out = {*flag, Source::kFlag};
  return absl::OkStatus();
}

absl::Status Pick(setting_kind::HandleKinds, const SettingRow& row,
                  const std::optional<std::string>& flag, const v1::DaemonConfig& file,
                  Setting<std::vector<HandleKind>>* out) {
  std::vector<std::string> names = FileTexts(file, row);
  Source from = names.empty() ? Source::kDefault : Source::kConfig;
  if (flag.has_value()) {
    names = absl::StrSplit(*flag, ',', absl::SkipEmpty());
    from = Source::kFlag;
  }
  if (from == Source::kDefault) return absl::OkStatus();
  std::vector<HandleKind> kinds;
  for (const std::string& name : names) {
    absl::StatusOr<HandleKind> kind = ParseHandleKind(name);
    if (!kind.ok()) return Bad(row, from, kind.status().message());
    kinds.push_back(*kind);
  }
  *out = {std::move(kinds), from};
  return absl::OkStatus();
}

// How each kind's value is written as a flag.
std::string ExactBytes(uint64_t v) {
  if (v != 0 && v % (uint64_t{1} << 30) == 0) return absl::StrCat(v >> 30, "GiB");
  if (v != 0 && v % (uint64_t{1} << 20) == 0) return absl::StrCat(v >> 20, "MiB");
  if (v != 0 && v % (uint64_t{1} << 10) == 0) return absl::StrCat(v >> 10, "KiB");
  return absl::StrCat(v);
}
std::string Format(setting_kind::Text, const std::string& v) { return v; }
std::string Format(setting_kind::Bytes, uint64_t v) { return ExactBytes(v); }
template <typename V, typename F>
std::string Format(setting_kind::Integer<V, F>, V v) {
  return absl::StrCat(v);
}
template <typename F>
std::string Format(setting_kind::Millis<F>, absl::Duration v) {
  return absl::StrCat(absl::ToInt64Milliseconds(v));
}
std::string Format(setting_kind::Seconds, absl::Duration v) {
  return absl::StrCat(absl::ToDoubleSeconds(v));
}
std::string Format(setting_kind::Number, double v) { return absl::StrCat(v); }
std::string Format(setting_kind::Bool, bool v) { return v ? "true" : "false"; }
std::string Format(setting_kind::HandleKinds, const std::vector<HandleKind>& v) {
  return absl::StrJoin(v, ",", [](std::string* out, HandleKind k) {
    absl::StrAppend(out, HandleKindName(k));
  });
}

// The rows' operations, for the row's kind and members.
template <typename Kind, std::optional<typename Kind::Flag> CommandLine::*kFlag,
          Setting<typename Kind::Value> Settings::*kMember>
absl::Status ResolveRow(const SettingRow& row, const CommandLine& flags,
                        const v1::DaemonConfig& file, Settings* s) {
  if (absl::Status st = Pick(Kind(), row, flags.*kFlag, file, &(s->*kMember)); !st.ok()) {
    return st;
  }
  if (row.rule.finish == nullptr) return absl::OkStatus();
  const std::string why = row.rule.finish(s);
  if (why.empty()) return absl::OkStatus();
  return Bad(row, (s->*kMember).source, why);
}

template <typename Kind, Setting<typename Kind::Value> Settings::*kMember>
std::string FormatRow(const Settings& s) {
  return Format(Kind(), (s.*kMember).value);
}

template <typename T, Setting<T> Settings::*kMember>
Source SourceOfRow(const Settings& s) {
  return (s.*kMember).source;
}

template <typename T, Setting<T> Settings::*kMember>
void KeepRow(const Settings& from, Settings* to) {
  to->*kMember = from.*kMember;
}

// The rows' Finish functions (setting_row.h), named by setting_table.h.
std::string KnownBackend(Settings* s) {
  if (s->backend.value == "sim" || s->backend.value == "cuda") return "";
  return absl::StrCat("unknown backend \"", s->backend.value, "\" (use sim or cuda)");
}

std::string SimDeviceSizes(Settings* s) {
  if (s->backend.value != "sim") return "";
  absl::StatusOr<std::vector<uint64_t>> sizes = ParseDeviceSizes(s->sim_devices.value);
  if (!sizes.ok()) return std::string(sizes.status().message());
  s->sim_device_sizes = *std::move(sizes);
  return "";
}

std::string DeviceHeadroom(Settings* s) {
  if (s->device_headroom.value.empty()) s->device_headroom.value = "auto";
  if (s->device_headroom.value == "auto") return "";
  absl::StatusOr<uint64_t> bytes = ParseByteSize(s->device_headroom.value);
  if (!bytes.ok()) return "must be auto, 0 or a size such as 2GiB";
  s->device_headroom_bytes = *bytes;
  return "";
}

std::string SimLinks(Settings* s) {
  if (s->backend.value != "sim") return "";
  absl::StatusOr<std::vector<PeerLink>> links = ParseSimTopology(
      s->sim_topology.value, static_cast<uint32_t>(s->sim_device_sizes.size()));
  if (!links.ok()) return std::string(links.status().message());
  s->sim_links = *std::move(links);
  return "";
}

std::string SimSlabCreateDelays(Settings* s) {
  for (absl::string_view item :
       absl::StrSplit(s->sim_slab_create_delay.value, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits(':', 1));
    uint32_t device = 0;
    absl::Duration delay;
    if (!absl::SimpleAtoi(kv.first, &device) || device >= s->sim_device_sizes.size() ||
        !absl::ParseDuration(kv.second, &delay) || delay < absl::ZeroDuration()) {
      return absl::StrCat("bad entry \"", item, "\" (want DEVICE:DURATION with a device below ",
                          s->sim_device_sizes.size(), ", e.g. 0:300ms)");
    }
    s->sim_slab_create_delays.emplace_back(device, delay);
  }
  return "";
}

std::string TenantSocketDir(Settings* s) {
  if (tenants::CheckSocketDir(s->tenant_socket_dir.value).ok()) return "";
  return "must be an absolute path without '.', '..', '//' or a trailing '/'";
}

std::string PowerOfTwo(Settings* s) {
  return absl::has_single_bit(s->max_alignment.value) ? "" : "must be a power of two";
}

std::string RetainedEvents(Settings* s) {
  const int64_t v = s->ledger_retain_events.value;
  if (v == 0 || (v >= 10000 && v <= 1'000'000'000'000)) return "";
  return "must be 0 (keep every event) or in [10000, 1000000000000]";
}

// Empty: the socket's path with ".state".
std::string StatePath(Settings* s) {
  if (s->state.value.empty()) s->state.value = absl::StrCat(s->socket.value, ".state");
  if (s->state.value == "none" || s->state.value[0] == '/') return "";
  return "must be an absolute path or none";
}

#define GPUMEMD_ROW(FLAG, MEMBER, KIND, FIELD, DEFAULT, RULE, WHEN, SHOWN, HELP)           \
  SettingRow{#FLAG,                                                                         \
             FIELD,                                                                         \
             When::WHEN,                                                                    \
             RULE,                                                                          \
             SHOWN,                                                                         \
             HELP,                                                                          \
             &ResolveRow<setting_kind::KIND, &CommandLine::FLAG, &Settings::MEMBER>,        \
             &FormatRow<setting_kind::KIND, &Settings::MEMBER>,                             \
             &SourceOfRow<setting_kind::KIND::Value, &Settings::MEMBER>,                    \
             &KeepRow<setting_kind::KIND::Value, &Settings::MEMBER>},
const SettingRow kRows[] = {GPUMEMD_SETTINGS(GPUMEMD_ROW)};
#undef GPUMEMD_ROW

}  // namespace

const char* SourceName(Source source) {
  switch (source) {
    case Source::kDefault: return "default";
    case Source::kConfig: return "config";
    case Source::kFlag: return "flag";
  }
  return "default";
}

absl::Span<const SettingRow> SettingRows() { return kRows; }

absl::StatusOr<Settings> ResolveSettings(const CommandLine& flags, const std::string& path,
                                         const v1::DaemonConfig& file) {
  Settings s;
  s.config_path = path;
  s.file = file;
  for (const SettingRow& row : kRows) {
    if (absl::Status st = row.resolve(row, flags, file, &s); !st.ok()) return st;
  }
  return s;
}

std::string DefaultsText() {
  const Settings d;
  std::vector<std::string> shown;
  std::vector<std::string> aside;
  for (const SettingRow& row : kRows) {
    switch (row.shown.where) {
      case Shown::Where::kValue:
        shown.push_back(absl::StrCat("--", row.flag, "=", row.format(d)));
        break;
      case Shown::Where::kText:
        shown.push_back(absl::StrCat("--", row.flag, "=", row.shown.text));
        break;
      case Shown::Where::kAside:
        aside.push_back(absl::StrCat("--", row.flag, ": ", row.shown.text));
        break;
      case Shown::Where::kHidden:
        break;
    }
  }
  std::string text = absl::StrJoin(shown, " ");
  if (!aside.empty()) absl::StrAppend(&text, " (", absl::StrJoin(aside, "; "), ")");
  return text;
}

std::vector<std::string> RestartOnlyChanges(const Settings& running, const Settings& next) {
  std::vector<std::string> changed;
  for (const SettingRow& row : kRows) {
    if (row.when != When::kStart || row.field == nullptr) continue;
    if (FileFieldText(running.file, row) != FileFieldText(next.file, row)) {
      changed.push_back(row.field);
    }
  }
  return changed;
}

void KeepRestartOnly(const Settings& running, Settings* next) {
  for (const SettingRow& row : kRows) {
    if (row.when == When::kStart) row.keep(running, next);
  }
  next->sim_device_sizes = running.sim_device_sizes;
  next->sim_links = running.sim_links;
  next->sim_slab_create_delays = running.sim_slab_create_delays;
}

}  // namespace gpumem
