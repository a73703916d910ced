// LedgerCheck: reads a ledger file (server/ledger, SQLite) from outside the
// daemon, read-only, and checks it the way an auditor would:
//  - PRAGMA integrity_check says "ok";
//  - the events, replayed in seq order, are consistent: an ALLOCATE for an
//    id not live, each ending event (FREE, SESSION_END, DAEMON_STOP,
//    DAEMON_RESTART) for an id that is, with the same tenant, device and
//    bytes; ids never reused after they ended;
//  - the replay's live set is exactly the `live` table (ids, tenants,
//    devices, bytes), and its bytes per tenant and device are the `usage`
//    table's current_bytes.
// A LEDGER_GAP event records an outage (writes failed for a while, the
// events were held in memory and written later) and how many events were
// dropped meanwhile (its bytes). Outages are counted; one that dropped
// events makes the replay inexact: it is reported, and the replay checks
// are not made after it.
#ifndef GPUMEMD_TESTS_SOAK_LEDGER_CHECK_H_
#define GPUMEMD_TESTS_SOAK_LEDGER_CHECK_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace gpumem {
namespace soak {

struct LedgerReport {
  bool opened = false;
  std::string integrity;          // "ok", or SQLite's complaint
  uint64_t events = 0;
  uint64_t gaps = 0;              // LEDGER_GAP events: write outages
  uint64_t lost_events = 0;       // events they say were dropped
  uint64_t restart_events = 0;    // DAEMON_RESTART events
  uint64_t replay_live = 0;       // live after the replay
  uint64_t live_rows = 0;         // rows of the live table
  std::vector<std::string> problems;  // empty: everything checked holds

  bool ok() const { return opened && integrity == "ok" && problems.empty(); }
  bool exact() const { return lost_events == 0; }
};

LedgerReport CheckLedger(const std::string& path);

// Rows of the live table (-1 if the file cannot be read).
int64_t LiveRows(const std::string& path);

// The allocation ids of the live table (empty if the file cannot be read).
std::vector<uint64_t> LiveIds(const std::string& path);

// The highest event seq (0 for none, -1 if the file cannot be read).
int64_t LastSeq(const std::string& path);

// How an allocation ended: the first ending event (FREE, SESSION_END,
// DAEMON_STOP, DAEMON_RESTART) of its id after a given seq.
struct Ending {
  std::string kind;
  std::string detail;
};
// Every allocation that ended after `after_seq`, by id; and in `resumed`
// the DAEMON_RESUMED events' details after it (a restart's summary).
std::map<uint64_t, Ending> EndingsAfter(const std::string& path, int64_t after_seq,
                                        std::vector<std::string>* resumed = nullptr);

}  // namespace soak
}  // namespace gpumem

#endif  // GPUMEMD_TESTS_SOAK_LEDGER_CHECK_H_
