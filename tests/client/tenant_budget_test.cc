// TenantMemInfo (client/lib/tenant_budget.h): what mem_get_info answers from the
// daemon's GetStats, GetUsage and GetSession, on made-up answers.
#include "client/lib/tenant_budget.h"

#include "gtest/gtest.h"

namespace gpumem {
namespace client {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kMiB = uint64_t{1} << 20;

struct Answers {
  v1::GetStatsResponse stats;
  v1::GetUsageResponse usage;
  v1::Session session;
};

// Two 16 GiB devices; device 0 has 10 GiB free (others hold the rest).
// Tenant "ml" (id 3) has charged 1 GiB on device 0 and 512 MiB on 1, and
// retained 256 MiB on device 0.
Answers Make() {
  Answers a;
  for (int i = 0; i < 2; ++i) {
    v1::DeviceStats* d = a.stats.add_devices();
    d->set_index(i);
    d->set_total_bytes(16 * kGiB);
    d->set_free_bytes(i == 0 ? 10 * kGiB : 15 * kGiB);
  }
  v1::TenantStats* ts = a.stats.add_tenants();
  ts->set_tenant(3);
  ts->set_name("ml");
  ts->set_retained_bytes(256 * kMiB);
  v1::TenantDeviceStats* td = ts->add_devices();
  td->set_device_index(0);
  td->set_retained_bytes(256 * kMiB);
  v1::TenantUsage* tu = a.usage.add_tenants();
  tu->set_name("ml");
  tu->set_current_bytes(kGiB + 512 * kMiB);
  v1::DeviceUsage* d0 = tu->add_devices();
  d0->set_device_index(0);
  d0->set_current_bytes(kGiB);
  v1::DeviceUsage* d1 = tu->add_devices();
  d1->set_device_index(1);
  d1->set_current_bytes(512 * kMiB);
  a.session.set_tenant(3);
  a.session.set_tenant_name("ml");
  return a;
}

TEST(TenantMemInfo, WithoutAQuotaItIsTheDevice) {
  Answers a = Make();
  absl::StatusOr<MemInfo> m = TenantMemInfo(a.stats, a.usage, a.session, 0, 0);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->total_bytes, 16 * kGiB);
  EXPECT_EQ(m->free_bytes, 10 * kGiB);
}

TEST(TenantMemInfo, TheTotalQuotaCapsBothAndCountsRetainedBytes) {
  Answers a = Make();
  a.usage.mutable_tenants(0)->mutable_quota()->set_total_bytes(4 * kGiB);
  absl::StatusOr<MemInfo> m = TenantMemInfo(a.stats, a.usage, a.session, 0, 0);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->total_bytes, 4 * kGiB);
  // 4 GiB - (1.5 GiB charged + 256 MiB retained).
  EXPECT_EQ(m->free_bytes, 4 * kGiB - kGiB - 512 * kMiB - 256 * kMiB);
}

TEST(TenantMemInfo, ADeviceQuotaCountsThatDeviceOnly) {
  Answers a = Make();
  v1::DeviceQuota* dq = a.usage.mutable_tenants(0)->mutable_quota()->add_devices();
  dq->set_device("1");
  dq->set_bytes(2 * kGiB);
  absl::StatusOr<MemInfo> m1 = TenantMemInfo(a.stats, a.usage, a.session, 1, 0);
  ASSERT_TRUE(m1.ok());
  EXPECT_EQ(m1->total_bytes, 2 * kGiB);
  EXPECT_EQ(m1->free_bytes, 2 * kGiB - 512 * kMiB);
  absl::StatusOr<MemInfo> m0 = TenantMemInfo(a.stats, a.usage, a.session, 0, 0);
  ASSERT_TRUE(m0.ok());
  EXPECT_EQ(m0->total_bytes, 16 * kGiB);
  EXPECT_EQ(m0->free_bytes, 10 * kGiB);
}

TEST(TenantMemInfo, TheDeviceCanBeTighterThanTheQuota) {
  Answers a = Make();
  a.usage.mutable_tenants(0)->mutable_quota()->set_total_bytes(12 * kGiB);
  a.stats.mutable_devices(0)->set_free_bytes(kGiB);
  absl::StatusOr<MemInfo> m = TenantMemInfo(a.stats, a.usage, a.session, 0, 0);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->total_bytes, 12 * kGiB);
  EXPECT_EQ(m->free_bytes, kGiB);
}

TEST(TenantMemInfo, IdleLeaseBytesAreFreeButNeverBeyondTotal) {
  Answers a = Make();
  a.usage.mutable_tenants(0)->mutable_quota()->set_total_bytes(2 * kGiB);
  absl::StatusOr<MemInfo> m = TenantMemInfo(a.stats, a.usage, a.session, 0, 64 * kMiB);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->free_bytes, 2 * kGiB - kGiB - 512 * kMiB - 256 * kMiB + 64 * kMiB);
  // A full quota: nothing left but what the process holds idle.
  a.usage.mutable_tenants(0)->mutable_quota()->set_total_bytes(kGiB);
  m = TenantMemInfo(a.stats, a.usage, a.session, 0, 64 * kMiB);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->free_bytes, 64 * kMiB);
  m = TenantMemInfo(a.stats, a.usage, a.session, 0, 8 * kGiB);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->free_bytes, kGiB);
}

TEST(TenantMemInfo, UnknownDeviceIsInvalidAndAnotherTenantsQuotaDoesNotApply) {
  Answers a = Make();
  EXPECT_EQ(TenantMemInfo(a.stats, a.usage, a.session, 2, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  a.usage.mutable_tenants(0)->mutable_quota()->set_total_bytes(kGiB);
  a.session.set_tenant_name("other");
  a.session.set_tenant(9);
  absl::StatusOr<MemInfo> m = TenantMemInfo(a.stats, a.usage, a.session, 0, 0);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->total_bytes, 16 * kGiB);
}

}  // namespace
}  // namespace client
}  // namespace gpumem
