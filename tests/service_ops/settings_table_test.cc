// The settings table (server/config/setting_table.h) against what it must
// agree with: the config schema (every DaemonConfig field is a row's, or the
// tenant directory's), the README's settings table (every flag of
// `gpumemd --help` and every config field has a README row; a row's field
// and default read there as the table says) and its Reloading section (it
// names the restart-only and the reloadable fields as the table has them),
// and the errors settings have always given (one per kind of rule).
//
// Arguments: README.md, the gpumemd binary.
#include <stdio.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/config/settings.h"

namespace gpumem {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

std::string g_readme_path;
std::string g_gpumemd_path;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> Backticked(const std::string& text) {
  std::vector<std::string> names;
  static const std::regex kTicked("`([^`]*)`");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kTicked);
       it != std::sregex_iterator(); ++it) {
    names.push_back((*it)[1]);
  }
  return names;
}

// One row of the README's settings table.
struct ReadmeRow {
  std::string flag;                 // "slab_size", or "" (config only)
  std::vector<std::string> fields;  // "pool.slab_size"
  std::string default_cell;
};

// The table under "## Settings": cells split at '|' not escaped as "\|".
std::vector<ReadmeRow> ReadmeSettings(const std::string& readme) {
  std::vector<ReadmeRow> rows;
  const size_t start = readme.find("\n## Settings\n");
  if (start == std::string::npos) return rows;
  std::istringstream lines(readme.substr(start));
  std::string line;
  bool in_table = false;
  while (std::getline(lines, line)) {
    if (!absl::StartsWith(line, "|")) {
      if (in_table) break;
      continue;
    }
    in_table = true;
    std::vector<std::string> cells;
    std::string cell;
    for (size_t i = 1; i < line.size(); ++i) {
      if (line[i] == '|' && line[i - 1] != '\\') {
        cells.push_back(std::string(absl::StripAsciiWhitespace(cell)));
        cell.clear();
      } else {
        cell += line[i];
      }
    }
    if (cells.size() < 4 || cells[0] == "flag" || absl::StartsWith(cells[0], "---")) continue;
    ReadmeRow row;
    static const std::regex kFlag("--([a-z0-9_]+)");
    std::smatch m;
    if (std::regex_search(cells[0], m, kFlag)) row.flag = m[1];
    row.fields = Backticked(cells[1]);
    row.default_cell = cells[2];
    rows.push_back(row);
  }
  return rows;
}

// The flags `gpumemd --help` lists.
std::set<std::string> HelpFlags() {
  std::set<std::string> flags;
  FILE* out = popen((g_gpumemd_path + " --help 2>&1").c_str(), "r");
  if (out == nullptr) return flags;
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), out)) > 0) text.append(buf, n);
  pclose(out);
  static const std::regex kListed("\n    --([a-z0-9_]+) ");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kListed);
       it != std::sregex_iterator(); ++it) {
    flags.insert((*it)[1]);
  }
  return flags;
}

// What the README's default cell starts with for `row`.
std::string ReadmeDefault(const SettingRow& row) {
  switch (row.shown.where) {
    case Shown::Where::kText:
      return absl::StrCat("`", row.shown.text, "`");
    case Shown::Where::kAside:
      return row.shown.text;
    case Shown::Where::kValue:
    case Shown::Where::kHidden:
      break;
  }
  const std::string value = row.format(Settings());
  return value.empty() ? "none" : absl::StrCat("`", value, "`");
}

bool IsTenantSectionField(const std::string& field) {
  for (const char* f : kTenantSectionFields) {
    if (field == f) return true;
  }
  return false;
}

// Every field of DaemonConfig, nested messages' as "pool.slab_size" (the
// tenant section's message fields stay whole: "tenant").
void ConfigFields(const Descriptor* d, const std::string& prefix,
                  std::vector<std::string>* out) {
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const std::string name = prefix + f->name();
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !f->is_repeated()) {
      ConfigFields(f->message_type(), name + ".", out);
    } else {
      out->push_back(name);
    }
  }
}

// A DaemonConfig with only `path` set: "/1" for a string, 1 for a number,
// "memfd" for a list.
v1::DaemonConfig WithField(const std::string& path) {
  v1::DaemonConfig config;
  google::protobuf::Message* holder = &config;
  std::vector<std::string> parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const FieldDescriptor* f = holder->GetDescriptor()->FindFieldByName(parts[i]);
    holder = holder->GetReflection()->MutableMessage(holder, f);
  }
  const FieldDescriptor* f = holder->GetDescriptor()->FindFieldByName(parts.back());
  const auto* r = holder->GetReflection();
  if (f->is_repeated()) {
    r->AddString(holder, f, "memfd");
    return config;
  }
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING: r->SetString(holder, f, "/1"); break;
    case FieldDescriptor::CPPTYPE_INT32: r->SetInt32(holder, f, 1); break;
    case FieldDescriptor::CPPTYPE_INT64: r->SetInt64(holder, f, 1); break;
    case FieldDescriptor::CPPTYPE_UINT32: r->SetUInt32(holder, f, 1); break;
    case FieldDescriptor::CPPTYPE_DOUBLE: r->SetDouble(holder, f, 1); break;
    default: ADD_FAILURE() << path << ": a field type no kind reads";
  }
  return config;
}

TEST(SettingsTable, EveryRowsFieldIsReadByItsKind) {
  for (const SettingRow& row : SettingRows()) {
    if (row.field == nullptr) continue;
    SCOPED_TRACE(row.flag);
    std::vector<std::string> fields;
    ConfigFields(v1::DaemonConfig::descriptor(), "", &fields);
    ASSERT_NE(std::find(fields.begin(), fields.end(), row.field), fields.end())
        << row.field << " is not a DaemonConfig field";
    // Set in the file, the setting comes from the file (or is refused
    // naming the file's field): the row reads the field its kind expects.
    absl::StatusOr<Settings> s = ResolveSettings(CommandLine(), "f", WithField(row.field));
    if (s.ok()) {
      EXPECT_EQ(row.source(*s), Source::kConfig) << row.field;
    } else {
      EXPECT_TRUE(absl::StartsWith(s.status().message(),
                                   absl::StrCat("config field ", row.field, ": ")))
          << s.status();
    }
  }
}

TEST(SettingsTable, EveryConfigFieldIsARowsOrTheTenantDirectorys) {
  std::set<std::string> row_fields;
  for (const SettingRow& row : SettingRows()) {
    if (row.field != nullptr) EXPECT_TRUE(row_fields.insert(row.field).second) << row.field;
  }
  std::vector<std::string> fields;
  ConfigFields(v1::DaemonConfig::descriptor(), "", &fields);
  for (const std::string& field : fields) {
    EXPECT_TRUE(row_fields.count(field) != 0 || IsTenantSectionField(field))
        << field << ": a DaemonConfig field that no settings row reads";
  }
}

TEST(SettingsTable, ReadmeTableHasEveryFlagAndFieldAsTheTableSays) {
  const std::vector<ReadmeRow> readme = ReadmeSettings(ReadFile(g_readme_path));
  ASSERT_GT(readme.size(), 10u) << "no settings table in " << g_readme_path;
  std::map<std::string, ReadmeRow> by_flag;
  std::set<std::string> readme_fields;
  for (const ReadmeRow& r : readme) {
    if (!r.flag.empty()) EXPECT_TRUE(by_flag.emplace(r.flag, r).second) << "twice: " << r.flag;
    readme_fields.insert(r.fields.begin(), r.fields.end());
  }

  for (const SettingRow& row : SettingRows()) {
    SCOPED_TRACE(row.flag);
    auto it = by_flag.find(row.flag);
    ASSERT_NE(it, by_flag.end()) << "README.md's settings table has no row for --" << row.flag;
    const std::vector<std::string> want =
        row.field == nullptr ? std::vector<std::string>{} : std::vector<std::string>{row.field};
    EXPECT_EQ(it->second.fields, want) << "config field column of --" << row.flag;
    EXPECT_TRUE(absl::StartsWith(it->second.default_cell, ReadmeDefault(row)))
        << "default column of --" << row.flag << ": \"" << it->second.default_cell
        << "\", want it to start with \"" << ReadmeDefault(row) << "\"";
  }

  // Every flag the daemon has is in the README, and no other.
  const std::set<std::string> help = HelpFlags();
  ASSERT_GT(help.size(), SettingRows().size());
  for (const std::string& flag : help) {
    EXPECT_EQ(by_flag.count(flag), 1u) << "README.md's settings table has no row for --" << flag;
  }
  for (const auto& [flag, row] : by_flag) {
    EXPECT_EQ(help.count(flag), 1u) << "README.md names --" << flag << ", which gpumemd lacks";
  }
  // Every config field is in the README; config-only rows are the tenant
  // directory's.
  std::vector<std::string> fields;
  ConfigFields(v1::DaemonConfig::descriptor(), "", &fields);
  for (const std::string& field : fields) {
    EXPECT_EQ(readme_fields.count(field), 1u) << "README.md's settings table lacks " << field;
  }
  for (const ReadmeRow& r : readme) {
    if (!r.flag.empty()) continue;
    for (const std::string& field : r.fields) {
      EXPECT_TRUE(IsTenantSectionField(field)) << field << ": a README row without a flag";
    }
  }
}

TEST(SettingsTable, ReadmeReloadingNamesWhatReloadsAndWhatWaits) {
  const std::string readme = ReadFile(g_readme_path);
  const size_t at = readme.find("\n### Reloading\n");
  ASSERT_NE(at, std::string::npos);
  const std::string section = readme.substr(at, readme.find("\n## ", at + 1) - at);
  // "A good one applies its reloadable settings ...: `a`, `b`, ..., and the
  // tenant section"; "Changes to `x`, `y`, ... are logged as taking effect
  // at the next start".
  const size_t good = section.find("A good one");
  const size_t tenant = section.find("the tenant section", good);
  const size_t changes = section.find("Changes to");
  const size_t next = section.find("next start", changes);
  ASSERT_TRUE(good != std::string::npos && tenant != std::string::npos &&
              changes != std::string::npos && next != std::string::npos);
  const std::vector<std::string> reloaded = Backticked(section.substr(good, tenant - good));
  const std::vector<std::string> waiting = Backticked(section.substr(changes, next - changes));
  const std::set<std::string> reload_set(reloaded.begin(), reloaded.end());
  const std::set<std::string> wait_set(waiting.begin(), waiting.end());
  for (const SettingRow& row : SettingRows()) {
    if (row.field == nullptr) continue;
    if (row.when == When::kReload) {
      EXPECT_EQ(reload_set.count(row.field), 1u) << row.field << " reloads; README: not said";
      EXPECT_EQ(wait_set.count(row.field), 0u) << row.field << " reloads; README: it waits";
    } else {
      EXPECT_EQ(wait_set.count(row.field), 1u) << row.field << " waits; README: not said";
      EXPECT_EQ(reload_set.count(row.field), 0u) << row.field << " waits; README: it reloads";
    }
  }
}

// The words of each kind of rule, from a flag and from the file.
TEST(SettingsTable, ErrorsReadAsTheyAlwaysHave) {
  struct Case {
    std::string flag;
    std::optional<std::string> value;  // nullopt: the file's `config`
    std::string config;
    std::string says;
  };
  auto flags_with = [](const std::string& name, const std::string& value) {
    CommandLine c;
    bool found = false;
#define GPUMEMD_SET_FLAG(FLAG, MEMBER, KIND, ...)                               \
  if (name == #FLAG) {                                                          \
    setting_kind::KIND::Flag v;                                                 \
    std::istringstream(value) >> v;                                             \
    c.FLAG = v;                                                                 \
    found = true;                                                               \
  }
    GPUMEMD_SETTINGS(GPUMEMD_SET_FLAG)
#undef GPUMEMD_SET_FLAG
    EXPECT_TRUE(found) << name;
    return c;
  };
  const std::vector<Case> cases = {
      {"backend", "tpu", "", "--backend: unknown backend \"tpu\" (use sim or cuda)"},
      {"slab_size", "0", "", "--slab_size: must be > 0"},
      {"max_alignment", "3MiB", "", "--max_alignment: must be a power of two"},
      {"reserve_fraction", "1.5", "", "--reserve_fraction must be in [0, 1]"},
      {"drain_seconds", "-1", "", "--drain_seconds must be >= 0"},
      {"empty_slab_release_seconds", "-1", "", "--empty_slab_release_seconds must be >= 0"},
      {"stream_threads", "65", "", "--stream_threads must be in [1, 64]"},
      {"restore_grace_seconds", "90000", "", "--restore_grace_seconds: must be in [0, 86400]"},
      {"reclaim_wait_ms", "10001", "",
       "--reclaim_wait_ms: must be in [0, 10000] milliseconds"},
      {"max_wait_ms", "0", "", "--max_wait_ms: must be in [1, 86400000]"},
      {"fd_reserve", "15", "", "--fd_reserve: must be in [16, 1000000]"},
      {"max_receive_message_size", "1KiB", "",
       "--max_receive_message_size: must be in [4.00 KiB, 1.00 GiB]"},
      {"ledger_retain_events", "5", "",
       "--ledger_retain_events: must be 0 (keep every event) or in [10000, 1000000000000]"},
      {"state", "rel", "", "--state: must be an absolute path or none"},
      {"", std::nullopt, "restore_grace_seconds: 90000",
       "config field restore_grace_seconds: must be in [0, 86400]"},
      {"", std::nullopt, "reclaim_wait_ms: 10001",
       "config field reclaim_wait_ms: must be at most 10000 milliseconds"},
      {"", std::nullopt, "wait_bypass_limit: 1000001",
       "config field wait_bypass_limit: must be at most 1000000"},
      {"", std::nullopt, "fd_reserve: 15", "config field fd_reserve: must be in [16, 1000000]"},
      {"", std::nullopt, "pool { min_slab_size: \"0\" }",
       "config field pool.min_slab_size: must be > 0"},
      {"", std::nullopt, "grpc_memory_limit: \"1MiB\"",
       "config field grpc_memory_limit: must be in [16.00 MiB, 1.00 TiB]"},
  };
  for (const Case& c : cases) {
    v1::DaemonConfig file;
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(c.config, &file)) << c.config;
    const CommandLine flags = c.value.has_value() ? flags_with(c.flag, *c.value) : CommandLine();
    absl::StatusOr<Settings> s = ResolveSettings(flags, "f", file);
    ASSERT_FALSE(s.ok()) << c.says;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.status().message(), c.says);
  }
}

// --help's defaults line: each kind's value as its flag is written, a text
// in its place, the aside last.
TEST(SettingsTable, HelpShowsTheDefaultsAsFlagsWriteThem) {
  const std::string text = DefaultsText();
  for (const char* shown :
       {"--backend=sim ", " --slab_size=1GiB ", " --min_slab_size=2MiB ",
        " --empty_slab_release_seconds=30 ", " --reserve_fraction=0 ",
        " --state=<the socket's path>.state ", " --reclaim_wait_ms=300 ",
        " --max_wait_ms=60000 ", " --max_connections_per_uid=256 "}) {
    EXPECT_TRUE(absl::StrContains(text, shown)) << shown << " not in: " << text;
  }
  EXPECT_FALSE(absl::StrContains(text, "--sim_topology")) << text;
  EXPECT_TRUE(absl::EndsWith(text, " (--admin_group: root only; --handle_kinds: every kind "
                                   "the backend makes; --metrics_listen: off)"))
      << text;
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc != 3) {
    fprintf(stderr, "usage: %s README.md GPUMEMD\n", argv[0]);
    return 2;
  }
  gpumem::g_readme_path = argv[1];
  gpumem::g_gpumemd_path = argv[2];
  return RUN_ALL_TESTS();
}
