// The ledger's Prometheus figures (server/metrics/ledger_collector.h) say
// what the writer's stats say: a ledger whose disk is full reads failing,
// with its held and dropped events; one that writes again reads 0; a
// ledger that is off has no families.
#include "server/metrics/ledger_collector.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <map>
#include <string>

namespace gpumem {
namespace {

std::map<std::string, double> Values(const ledger::TenantLedger& l) {
  std::map<std::string, double> out;
  for (const prometheus::MetricFamily& f : LedgerCollector(&l).Collect()) {
    EXPECT_EQ(f.metric.size(), 1u) << f.name;
    if (f.metric.empty()) continue;
    out[f.name] = f.type == prometheus::MetricType::Counter ? f.metric[0].counter.value
                                                             : f.metric[0].gauge.value;
  }
  return out;
}

ledger::LedgerEvent Alloc(uint64_t id) {
  ledger::LedgerEvent e;
  e.kind = ledger::EventKind::kAllocate;
  e.tenant = "ml";
  e.device = 0;
  e.bytes = 10;
  e.allocation_id = id;
  return e;
}

TEST(LedgerMetricsTest, AFullDiskReadsFailingWithItsHeldAndDroppedEvents) {
  char tmpl[] = "/tmp/ledger-metrics-XXXXXX";
  ledger::LedgerOptions o;
  o.path = std::string(mkdtemp(tmpl)) + "/ledger.db";
  o.max_held = 100;
  auto l = ledger::TenantLedger::Open(o);
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_TRUE((*l)->Flush().ok());
  std::map<std::string, double> v = Values(**l);
  EXPECT_EQ(v.size(), 10u);
  EXPECT_EQ(v["gpumemd_ledger_churn_folded_pairs_total"], 0);
  EXPECT_EQ(v["gpumemd_ledger_failing"], 0);
  (*l)->SetMaxPageCountForTest(1);
  for (uint64_t i = 0; i < 300; ++i) (*l)->Append(Alloc((*l)->first_allocation_id() + i));
  for (int i = 0; i < 100 && (*l)->stats().dropped_events < 200; ++i) {
    (*l)->Flush().IgnoreError();
  }
  v = Values(**l);
  EXPECT_EQ(v["gpumemd_ledger_failing"], 1);
  EXPECT_EQ(v["gpumemd_ledger_held_events"], 100);
  EXPECT_EQ(v["gpumemd_ledger_dropped_events_total"], 200);
  EXPECT_GE(v["gpumemd_ledger_failed_commits_total"], 1);
  (*l)->SetMaxPageCountForTest(1 << 30);
  absl::Status written = (*l)->Flush();
  for (int i = 0; i < 100 && !written.ok(); ++i) written = (*l)->Flush();
  ASSERT_TRUE(written.ok()) << written;
  v = Values(**l);
  EXPECT_EQ(v["gpumemd_ledger_failing"], 0);
  EXPECT_EQ(v["gpumemd_ledger_held_events"], 0);
  EXPECT_GE(v["gpumemd_ledger_committed_events_total"], 100);
  EXPECT_GT(v["gpumemd_ledger_writer_cpu_seconds_total"], 0);
}

TEST(LedgerMetricsTest, NoLedgerNoFamilies) {
  auto l = ledger::TenantLedger::Open({});
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(LedgerCollector(l->get()).Collect().empty());
}

}  // namespace
}  // namespace gpumem
