#include "tests/soak/ledger_check.h"

#include <sqlite3.h>

#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace gpumem {
namespace soak {
namespace {

struct Db {
  sqlite3* db = nullptr;
  ~Db() { sqlite3_close(db); }
};
struct Stmt {
  sqlite3_stmt* s = nullptr;
  ~Stmt() { sqlite3_finalize(s); }
};

std::string Text(sqlite3_stmt* s, int i) {
  const unsigned char* t = sqlite3_column_text(s, i);
  return t == nullptr ? "" : reinterpret_cast<const char*>(t);
}

bool Open(const std::string& path, Db* db) {
  if (sqlite3_open_v2(path.c_str(), &db->db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    return false;
  }
  sqlite3_busy_timeout(db->db, 5000);
  return true;
}

}  // namespace

int64_t LiveRows(const std::string& path) {
  Db db;
  if (!Open(path, &db)) return -1;
  Stmt q;
  if (sqlite3_prepare_v2(db.db, "SELECT COUNT(*) FROM live", -1, &q.s, nullptr) != SQLITE_OK ||
      sqlite3_step(q.s) != SQLITE_ROW) {
    return -1;
  }
  return sqlite3_column_int64(q.s, 0);
}

std::vector<uint64_t> LiveIds(const std::string& path) {
  std::vector<uint64_t> out;
  Db db;
  if (!Open(path, &db)) return out;
  Stmt q;
  if (sqlite3_prepare_v2(db.db, "SELECT allocation_id FROM live", -1, &q.s, nullptr) !=
      SQLITE_OK) {
    return out;
  }
  while (sqlite3_step(q.s) == SQLITE_ROW) {
    out.push_back(static_cast<uint64_t>(sqlite3_column_int64(q.s, 0)));
  }
  return out;
}

int64_t LastSeq(const std::string& path) {
  Db db;
  if (!Open(path, &db)) return -1;
  Stmt q;
  if (sqlite3_prepare_v2(db.db, "SELECT COALESCE(MAX(seq), 0) FROM events", -1, &q.s,
                         nullptr) != SQLITE_OK ||
      sqlite3_step(q.s) != SQLITE_ROW) {
    return -1;
  }
  return sqlite3_column_int64(q.s, 0);
}

std::map<uint64_t, Ending> EndingsAfter(const std::string& path, int64_t after_seq,
                                        std::vector<std::string>* resumed) {
  std::map<uint64_t, Ending> out;
  Db db;
  if (!Open(path, &db)) return out;
  Stmt q;
  if (sqlite3_prepare_v2(db.db,
                         "SELECT kind, allocation_id, detail FROM events WHERE seq > ? AND "
                         "kind IN ('FREE', 'SESSION_END', 'DAEMON_STOP', 'DAEMON_RESTART', "
                         "'DAEMON_RESUMED') ORDER BY seq",
                         -1, &q.s, nullptr) != SQLITE_OK) {
    return out;
  }
  sqlite3_bind_int64(q.s, 1, after_seq);
  while (sqlite3_step(q.s) == SQLITE_ROW) {
    const std::string kind = Text(q.s, 0);
    if (kind == "DAEMON_RESUMED") {
      if (resumed != nullptr) resumed->push_back(Text(q.s, 2));
      continue;
    }
    out.try_emplace(static_cast<uint64_t>(sqlite3_column_int64(q.s, 1)),
                    Ending{kind, Text(q.s, 2)});
  }
  return out;
}

LedgerReport CheckLedger(const std::string& path) {
  LedgerReport r;
  Db db;
  if (!Open(path, &db)) {
    r.problems.push_back(absl::StrCat("cannot open ", path, ": ", sqlite3_errmsg(db.db)));
    return r;
  }
  r.opened = true;
  // One read transaction: the daemon may be writing.
  sqlite3_exec(db.db, "BEGIN", nullptr, nullptr, nullptr);
  {
    Stmt q;
    if (sqlite3_prepare_v2(db.db, "PRAGMA integrity_check", -1, &q.s, nullptr) == SQLITE_OK) {
      while (sqlite3_step(q.s) == SQLITE_ROW) {
        r.integrity += (r.integrity.empty() ? "" : "; ") + Text(q.s, 0);
      }
    } else {
      r.integrity = sqlite3_errmsg(db.db);
    }
  }
  using Row = std::tuple<std::string, int64_t, int64_t>;  // tenant, device, bytes
  std::map<uint64_t, Row> live;
  std::set<uint64_t> ended;
  {
    Stmt q;
    if (sqlite3_prepare_v2(db.db,
                           "SELECT seq, kind, tenant, device, bytes, allocation_id FROM events "
                           "ORDER BY seq",
                           -1, &q.s, nullptr) != SQLITE_OK) {
      r.problems.push_back(absl::StrCat("cannot read events: ", sqlite3_errmsg(db.db)));
      return r;
    }
    while (sqlite3_step(q.s) == SQLITE_ROW) {
      ++r.events;
      const std::string kind = Text(q.s, 1);
      const Row row{Text(q.s, 2), sqlite3_column_int64(q.s, 3), sqlite3_column_int64(q.s, 4)};
      const uint64_t id = static_cast<uint64_t>(sqlite3_column_int64(q.s, 5));
      const int64_t seq = sqlite3_column_int64(q.s, 0);
      if (kind == "LEDGER_GAP") {
        ++r.gaps;
        r.lost_events += static_cast<uint64_t>(std::get<2>(row));
      }
      if (kind == "DAEMON_RESTART") ++r.restart_events;
      if (r.lost_events > 0 || r.problems.size() > 20) continue;
      if (kind == "ALLOCATE") {
        if (live.count(id) || ended.count(id)) {
          r.problems.push_back(absl::StrCat("seq ", seq, ": ALLOCATE of id ", id,
                                            live.count(id) ? " already live" : " ended before"));
        }
        live[id] = row;
      } else if (kind == "FREE" || kind == "SESSION_END" || kind == "DAEMON_STOP" ||
                 kind == "DAEMON_RESTART") {
        auto it = live.find(id);
        if (it == live.end()) {
          r.problems.push_back(absl::StrCat("seq ", seq, ": ", kind, " of id ", id,
                                            " that is not live"));
        } else {
          if (it->second != row) {
            r.problems.push_back(absl::StrCat("seq ", seq, ": ", kind, " of id ", id,
                                              " differs from its ALLOCATE"));
          }
          live.erase(it);
          ended.insert(id);
        }
      }
    }
  }
  r.replay_live = live.size();
  std::map<uint64_t, Row> table;
  {
    Stmt q;
    if (sqlite3_prepare_v2(db.db, "SELECT allocation_id, tenant, device, bytes FROM live", -1,
                           &q.s, nullptr) == SQLITE_OK) {
      while (sqlite3_step(q.s) == SQLITE_ROW) {
        table[static_cast<uint64_t>(sqlite3_column_int64(q.s, 0))] =
            Row{Text(q.s, 1), sqlite3_column_int64(q.s, 2), sqlite3_column_int64(q.s, 3)};
      }
    }
  }
  r.live_rows = table.size();
  if (r.lost_events > 0) return r;  // events were lost: no exact replay to compare
  if (table != live) {
    r.problems.push_back(absl::StrCat("replay has ", live.size(), " live allocations, the live "
                                      "table ", table.size(), " (or they differ)"));
  }
  std::map<std::pair<std::string, int64_t>, int64_t> bytes, usage;
  for (const auto& [id, row] : live) bytes[{std::get<0>(row), std::get<1>(row)}] += std::get<2>(row);
  {
    Stmt q;
    if (sqlite3_prepare_v2(db.db, "SELECT tenant, device, current_bytes FROM usage", -1, &q.s,
                           nullptr) == SQLITE_OK) {
      while (sqlite3_step(q.s) == SQLITE_ROW) {
        const int64_t device = sqlite3_column_int64(q.s, 1);
        const int64_t current = sqlite3_column_int64(q.s, 2);
        if (device < 0 || current == 0) continue;  // totals, and rows that are empty
        usage[{Text(q.s, 0), device}] = current;
      }
    }
  }
  if (usage != bytes) {
    r.problems.push_back("the usage table's current bytes differ from the replay's");
  }
  sqlite3_exec(db.db, "COMMIT", nullptr, nullptr, nullptr);
  return r;
}

}  // namespace soak
}  // namespace gpumem
