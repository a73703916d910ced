// Callers through a socket tenant's own socket, at the core (MemoryBroker
// over SimBackend with a quota book): whatever their uid (0 here, as in a
// pod) they are the socket's tenant, charged and limited as it, and they
// reach nothing of another tenant by any field: not its allocations (Free),
// its slabs (ExportSlab), its sessions (tokens), its figures (Stats), nor
// administration. A process calling through two sockets has two sessions.
// EndTenant (DeleteTenant's core) refuses while the tenant holds memory,
// or ends every session of it (their memory back, their waiters answered,
// its slabs released), also while its callers keep allocating (run under
// TSan). Callers are the test process and sleeping children forked before
// the broker's threads start; identity is taken as the transport would set
// it (PeerCred).
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/backend/sim_backend.h"
#include "server/core/memory_broker.h"
#include "server/quota/quota_book.h"
#include "server/tenants/tenant_directory.h"
#include "tests/common/poll_until.h"
#include "tests/core/stats_of.h"

namespace gpumem {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr int kChildren = 6;

pid_t SleepingChild() {
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    for (;;) pause();
  }
  return pid;
}

v1::AllocateRequest Request(uint64_t size, uint32_t wait_ms = 0) {
  v1::AllocateRequest r;
  r.set_size_bytes(size);
  r.set_wait_ms(wait_ms);
  return r;
}

v1::FreeRequest FreeOf(uint64_t id) {
  v1::FreeRequest r;
  r.set_id(id);
  return r;
}

const v1::TenantStats* TenantNamed(const v1::GetStatsResponse& s, const std::string& name) {
  for (const v1::TenantStats& t : s.tenants()) {
    if (t.name() == name) return &t;
  }
  return nullptr;
}

uint64_t Used(const v1::GetStatsResponse& s) {
  uint64_t used = 0;
  for (const v1::DeviceStats& d : s.devices()) used += d.used_bytes();
  return used;
}

class SocketTenantTest : public ::testing::Test {
 protected:
  SocketTenantTest() : backend_({256 * kMiB, 256 * kMiB}), quotas_(2) {
    for (int i = 0; i < kChildren; ++i) children_.push_back(SleepingChild());
  }

  void SetUp() override {
    // No configured tenants (each uid its own), two socket tenants.
    tenants::TenantDirectory dir;
    a_ = Put(&dir, "claim-a", "/run/t/a/s", 12 * kMiB);
    b_ = Put(&dir, "claim-b", "/run/t/b/s", 64 * kMiB);
    holder_ = std::make_unique<tenants::TenantDirectoryHolder>(std::move(dir));
    BrokerOptions o;
    o.pool.slab_size = 16 * kMiB;
    o.pool.granularity = 4096;
    o.pool.empty_release_after = absl::Hours(1);
    o.tenants = holder_.get();
    o.quotas = &quotas_;
    broker_ = std::make_unique<MemoryBroker>(&backend_, o);
    ASSERT_TRUE(broker_->Start().ok());
  }

  ~SocketTenantTest() override {
    broker_.reset();
    for (pid_t pid : children_) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }

  uint32_t Put(tenants::TenantDirectory* dir, const std::string& name, const std::string& socket,
               uint64_t total) {
    tenants::TenantDirectory::SocketTenantSpec spec;
    spec.name = name;
    spec.socket = socket;
    spec.quota.total_bytes = total;
    absl::StatusOr<tenants::TenantDirectory> next = dir->WithSocketTenant(spec);
    EXPECT_TRUE(next.ok()) << next.status();
    *dir = *std::move(next);
    const uint32_t id = dir->Find(name)->id;
    quotas_.SetQuota(id, dir->Find(name)->quota);
    return id;
  }

  // Child `i` (or this process, i < 0) as uid `uid`, through tenant
  // `socket`'s socket (0: the main socket).
  PeerCred Cred(int i, uid_t uid, uint32_t socket) const {
    PeerCred c{i < 0 ? getpid() : children_[i], uid, uid};
    c.socket_tenant = socket;
    return c;
  }
  static PeerCred Root() { return PeerCred{getpid(), 0, 0}; }

  uint64_t Alloc(const PeerCred& c, uint64_t size) {
    absl::StatusOr<v1::AllocateResponse> r = broker_->AllocateAndWait(c, Request(size));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->allocations(0).id() : 0;
  }
  void Remove(uint32_t id) { holder_->Replace(holder_->Get()->Without(id)); }

  SimBackend backend_;
  quota::QuotaBook quotas_;
  std::vector<pid_t> children_;
  std::unique_ptr<tenants::TenantDirectoryHolder> holder_;
  std::unique_ptr<MemoryBroker> broker_;
  uint32_t a_ = 0, b_ = 0;
};

TEST_F(SocketTenantTest, ChargedToTheSocketsTenantWhateverTheUidAndLimitedByIt) {
  Alloc(Cred(0, 0, a_), 4 * kMiB);     // uid 0, as in a pod
  Alloc(Cred(1, 4242, a_), 4 * kMiB);  // another uid, same socket: same tenant
  v1::GetStatsResponse s = StatsOf(*broker_, Root());
  const v1::TenantStats* a = TenantNamed(s, "claim-a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->tenant(), a_);
  EXPECT_EQ(a->used_bytes(), 8 * kMiB);
  EXPECT_EQ(TenantNamed(s, "uid-0"), nullptr) << "charged to the caller's uid";
  EXPECT_EQ(TenantNamed(s, "uid-4242"), nullptr);
  // 8 + 8 MiB > claim-a's 12 MiB: refused, naming its quota.
  absl::StatusOr<v1::AllocateResponse> over =
      broker_->AllocateAndWait(Cred(2, 0, a_), Request(8 * kMiB));
  ASSERT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  EXPECT_THAT(std::string(over.status().message()), HasSubstr("claim-a"));
  // claim-b is listed with its quota while it holds nothing.
  const v1::TenantStats* b = TenantNamed(s, "claim-b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->used_bytes(), 0u);
  EXPECT_EQ(b->quota().total_bytes(), 64 * kMiB);
}

TEST_F(SocketTenantTest, OneProcessHasOneSessionPerSocket) {
  absl::StatusOr<v1::Session> main = broker_->GetSession(Cred(-1, 0, 0));
  absl::StatusOr<v1::Session> in_a = broker_->GetSession(Cred(-1, 0, a_));
  absl::StatusOr<v1::Session> in_b = broker_->GetSession(Cred(-1, 0, b_));
  ASSERT_TRUE(main.ok() && in_a.ok() && in_b.ok());
  EXPECT_NE(main->session_id(), in_a->session_id());
  EXPECT_NE(in_a->session_id(), in_b->session_id());
  EXPECT_EQ(broker_->GetSession(Cred(-1, 0, a_))->session_id(), in_a->session_id());
  Alloc(Cred(-1, 0, 0), kMiB);
  Alloc(Cred(-1, 0, a_), 2 * kMiB);
  Alloc(Cred(-1, 0, b_), 3 * kMiB);
  v1::GetStatsResponse s = StatsOf(*broker_, Root());
  EXPECT_EQ(TenantNamed(s, "uid-0")->used_bytes(), kMiB);
  EXPECT_EQ(TenantNamed(s, "claim-a")->used_bytes(), 2 * kMiB);
  EXPECT_EQ(TenantNamed(s, "claim-b")->used_bytes(), 3 * kMiB);
}

TEST_F(SocketTenantTest, Uid0ThroughATenantSocketIsNotRoot) {
  const PeerCred pod = Cred(0, 0, a_);
  EXPECT_FALSE(broker_->IsAdmin(pod));
  EXPECT_TRUE(broker_->IsAdmin(Cred(0, 0, 0)));
  Alloc(Root(), kMiB);            // the node's root, main socket
  Alloc(Cred(1, 0, b_), kMiB);    // another claim's pod, also uid 0
  Alloc(pod, 2 * kMiB);
  // It sees its tenant and the sessions through its socket: not root's, not
  // claim-b's, though all are uid 0.
  v1::GetStatsResponse s = StatsOf(*broker_, pod, /*include_slabs=*/true);
  ASSERT_EQ(s.tenants_size(), 1);
  EXPECT_EQ(s.tenants(0).name(), "claim-a");
  ASSERT_EQ(s.sessions_size(), 1);
  EXPECT_EQ(s.sessions(0).pid(), children_[0]);
  for (const v1::DeviceStats& d : s.devices()) {
    for (const v1::SlabStats& slab : d.slabs()) {
      if (slab.has_tenant()) EXPECT_EQ(slab.tenant(), a_) << "another tenant's slab owner shown";
    }
  }
  // Root on the main socket does not see claim sessions as its own either
  // when it is not asking as an administrator: a non-admin uid 0 does not
  // exist, so check a plain uid instead.
  Alloc(Cred(2, 4242, a_), kMiB);
  v1::GetStatsResponse plain = StatsOf(*broker_, Cred(3, 4242, 0));
  for (const v1::SessionStats& ss : plain.sessions()) {
    EXPECT_NE(ss.pid(), children_[2]) << "uid 4242 on the main socket sees a pod's session";
  }
  EXPECT_EQ(TenantNamed(plain, "claim-a"), nullptr);
}

TEST_F(SocketTenantTest, FreeStaysInsideTheTenant) {
  const uint64_t in_a = Alloc(Cred(0, 4242, a_), kMiB);
  const uint64_t roots = Alloc(Root(), kMiB);
  // claim-b's pod (uid 0): neither claim-a's block nor root's own.
  for (uint64_t id : {in_a, roots}) {
    absl::StatusOr<v1::FreeResponse> f = broker_->Free(Cred(1, 0, b_), FreeOf(id));
    EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound) << f.status();
    EXPECT_THAT(std::string(f.status().message()), ::testing::Not(HasSubstr("4242")));
  }
  // The same uid on the main socket: not across a tenant socket, and told
  // nothing of it (as an id that does not exist).
  absl::StatusOr<v1::FreeResponse> same_uid = broker_->Free(Cred(2, 4242, 0), FreeOf(in_a));
  EXPECT_EQ(same_uid.status().code(), absl::StatusCode::kNotFound) << same_uid.status();
  // Another process of claim-a, any uid: its tenant's block.
  EXPECT_TRUE(broker_->Free(Cred(3, 7, a_), FreeOf(in_a)).ok());
  // The node's root may free anything.
  const uint64_t again = Alloc(Cred(0, 0, a_), kMiB);
  EXPECT_TRUE(broker_->Free(Root(), FreeOf(again)).ok());
  EXPECT_TRUE(broker_->Free(Root(), FreeOf(roots)).ok());
  EXPECT_EQ(Used(StatsOf(*broker_, Root())), 0u);
}

TEST_F(SocketTenantTest, SlabsAndTokensStayInsideTheTenant) {
  absl::StatusOr<v1::AllocateResponse> r = broker_->AllocateAndWait(Cred(0, 0, a_), Request(kMiB));
  ASSERT_TRUE(r.ok());
  const uint64_t slab = r->allocations(0).slab_id();
  absl::StatusOr<SlabFd> mine = broker_->ExportSlab(Cred(1, 0, a_), slab);
  ASSERT_TRUE(mine.ok()) << mine.status();
  close(mine->fd);
  // Another tenant's pod is told no such slab exists; the node's root (an
  // admin) is told whose it is not.
  absl::StatusOr<SlabFd> theirs = broker_->ExportSlab(Cred(2, 0, b_), slab);
  EXPECT_EQ(theirs.status().code(), absl::StatusCode::kNotFound) << theirs.status();
  theirs = broker_->ExportSlab(Cred(2, 0, 0), slab);
  EXPECT_EQ(theirs.status().code(), absl::StatusCode::kPermissionDenied) << theirs.status();
  // A connection-bound session (a pod without hostPID: pid 0) opened
  // through claim-a's socket: its token works on claim-a's socket only.
  PeerCred pod{0, 0, 0};
  pod.socket_tenant = a_;
  absl::StatusOr<std::shared_ptr<Session>> bound = broker_->BindConnection(pod);
  ASSERT_TRUE(bound.ok()) << bound.status();
  const std::string token = (*bound)->token();
  PeerCred in_b = pod, on_main = pod, in_a = pod;
  in_b.socket_tenant = b_;
  on_main.socket_tenant = 0;
  in_a.uid = 1234;  // another uid in the same pod
  EXPECT_EQ(broker_->ResolveSessionToken(token, in_b).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(broker_->ResolveSessionToken(token, on_main).status().code(),
            absl::StatusCode::kPermissionDenied);
  absl::StatusOr<uint64_t> resolved = broker_->ResolveSessionToken(token, in_a);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(*resolved, (*bound)->id());
  // A forged bound_session from another socket reaches nothing either.
  in_b.bound_session = (*bound)->id();
  EXPECT_EQ(broker_->AllocateAndWait(in_b, Request(kMiB)).status().code(),
            absl::StatusCode::kPermissionDenied);
  in_a.bound_session = *resolved;
  EXPECT_TRUE(broker_->AllocateAndWait(in_a, Request(kMiB)).ok());
  EXPECT_EQ(TenantNamed(StatsOf(*broker_, Root()), "claim-a")->used_bytes(), 2 * kMiB);
  broker_->EndConnection((*bound)->id());
  EXPECT_EQ(TenantNamed(StatsOf(*broker_, Root()), "claim-a")->used_bytes(), kMiB);
}

TEST_F(SocketTenantTest, EndTenantRefusesWhileItHoldsMemoryOrEndsItsSessions) {
  Alloc(Cred(0, 0, a_), 4 * kMiB);
  Alloc(Cred(1, 0, a_), 4 * kMiB);
  Alloc(Cred(2, 0, b_), 4 * kMiB);
  bool unlisted = false;
  absl::StatusOr<MemoryBroker::TenantEnded> refused =
      broker_->EndTenant(a_, "claim-a", /*end_sessions=*/false, [&] { unlisted = true; });
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("holds 2 allocation(s), 8.00 MiB, in 2 session(s)"));
  EXPECT_FALSE(unlisted);
  EXPECT_EQ(TenantNamed(StatsOf(*broker_, Root()), "claim-a")->used_bytes(), 8 * kMiB);
  Alloc(Cred(3, 0, a_), kMiB);  // still served

  // A request of claim-a waiting for room (past its quota). Its answer
  // comes through a std::promise (pthread-based, which ThreadSanitizer sees;
  // Debian's Abseil is not built for it).
  std::promise<absl::Status> answer;
  std::future<absl::Status> answered = answer.get_future();
  MemoryBroker::AllocateOutcome waiting = broker_->Allocate(
      Cred(0, 0, a_), Request(8 * kMiB, 60000),
      [&answer](MemoryBroker::AllocateAnswer a) { answer.set_value(a.status()); });
  ASSERT_EQ(waiting.kind, MemoryBroker::AllocateOutcome::Kind::kWaiting);

  absl::StatusOr<MemoryBroker::TenantEnded> ended =
      broker_->EndTenant(a_, "claim-a", /*end_sessions=*/true, [&] { Remove(a_); });
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->sessions, 3u);
  EXPECT_EQ(ended->allocations, 3u);
  ASSERT_EQ(answered.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_FALSE(answered.get().ok());
  // Admission counts its waiter out just after answering it: the tenant's
  // row (shown while it has waiters) may take a moment to go.
  v1::GetStatsResponse s;
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  do {
    s = StatsOf(*broker_, Root(), /*include_slabs=*/true);
  } while (TenantNamed(s, "claim-a") != nullptr && absl::Now() < deadline);
  EXPECT_EQ(Used(s), 4 * kMiB);  // claim-b's only
  EXPECT_EQ(TenantNamed(s, "claim-a"), nullptr) << "its slabs or its listing outlived it";
  for (const v1::DeviceStats& d : s.devices()) {
    for (const v1::SlabStats& slab : d.slabs()) EXPECT_NE(slab.tenant(), a_);
  }
  EXPECT_EQ(TenantNamed(s, "claim-b")->used_bytes(), 4 * kMiB);
  // Its socket's callers now reach nobody, with a reason.
  absl::StatusOr<v1::AllocateResponse> late = broker_->AllocateAndWait(Cred(0, 0, a_), Request(kMiB));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kPermissionDenied) << late.status();
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("claim-a"));
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("removed"));
}

TEST_F(SocketTenantTest, EndTenantWhileItsCallersKeepAllocating) {
  std::atomic<bool> stop{false};
  std::atomic<int> served{0};
  // 0: before EndTenant, every request is served; 1: while it runs, a
  // request may be refused (its session ended, or its tenant gone); 2:
  // after it, every request is refused, naming the removed tenant.
  std::atomic<int> phase{0};
  std::atomic<int> refused_after{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      // Even threads free at once; odd ones keep their last two blocks
      // (at most 6 MiB held in all: within the 12 MiB quota).
      const PeerCred c = Cred(i, 0, a_);
      std::vector<uint64_t> kept;
      while (!stop.load()) {
        const int began = phase.load();
        absl::StatusOr<v1::AllocateResponse> r = broker_->AllocateAndWait(c, Request(kMiB));
        if (!r.ok()) {
          const absl::StatusCode code = r.status().code();
          if (began == 2) {
            EXPECT_EQ(code, absl::StatusCode::kPermissionDenied) << r.status();
            ++refused_after;
          } else if (phase.load() == 0) {
            ADD_FAILURE() << "refused before EndTenant: " << r.status();
            return;
          } else {
            EXPECT_TRUE(code == absl::StatusCode::kPermissionDenied ||
                        code == absl::StatusCode::kFailedPrecondition)
                << r.status();
          }
          continue;
        }
        EXPECT_NE(began, 2) << "served after EndTenant returned";
        ++served;
        kept.push_back(r->allocations(0).id());
        if (kept.size() > (i % 2 == 0 ? 0u : 2u)) {
          broker_->Free(c, FreeOf(kept.front())).IgnoreError();
          kept.erase(kept.begin());
        }
      }
    });
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (served.load() < 50 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_GE(served.load(), 50);
  phase.store(1);
  absl::StatusOr<MemoryBroker::TenantEnded> ended =
      broker_->EndTenant(a_, "claim-a", /*end_sessions=*/true, [&] { Remove(a_); });
  phase.store(2);
  ASSERT_TRUE(ended.ok()) << ended.status();
  // The callers keep trying and are refused now (each thread a few times).
  EXPECT_TRUE(testing::PollUntil([&] { return refused_after.load() >= 20; }))
      << refused_after.load() << " refusals after EndTenant";
  stop.store(true);
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(broker_->live_allocations(), 0u) << "an allocation of the ended tenant survived";
  v1::GetStatsResponse s = StatsOf(*broker_, Root());
  EXPECT_EQ(Used(s), 0u);
  const v1::TenantStats* left = TenantNamed(s, "claim-a");
  EXPECT_EQ(left, nullptr) << left->DebugString();
}

}  // namespace
}  // namespace gpumem
