// Deterministic fuzz test of the broker's request paths (no libFuzzer): random
// AllocateRequests built from edge values, random protobuf bytes parsed into
// AllocateRequests, random Free ids and slab exports, checked against a model
// of the live allocations.
//
// Environment: GPUMEMD_FUZZ_ITERS (default 50000, 10000 under a sanitizer),
// GPUMEMD_FUZZ_SEED (default 20240601).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "proto/gpumem/v1/gpumem.pb.h"
#include "server/backend/sim_backend.h"
#include "server/core/memory_broker.h"
#include "tests/core/stats_of.h"


namespace gpumem {
namespace {

using ::gpumem::v1::AllocateRequest;
using ::gpumem::v1::AllocateResponse;
using ::gpumem::v1::PlacementRequest;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kDefaultAlignment = 256;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int kDefaultIters = 10000;
#else
constexpr int kDefaultIters = 50000;
#endif

int EnvInt(const char* name, int fallback) {
  const char* v = getenv(name);
  int out;
  if (v == nullptr || !absl::SimpleAtoi(v, &out) || out < 0) return fallback;
  return out;
}

class RequestFuzzer {
 public:
  RequestFuzzer(uint64_t seed, const std::vector<DeviceInfo>& devices)
      : rng_(seed), devices_(devices) {
    for (int k = 1; k < 64; ++k) {
      const uint64_t p = uint64_t{1} << k;
      edges_.insert(edges_.end(), {p - 1, p, p + 1});
    }
    edges_.insert(edges_.end(), {0, 1, 255, 256, 257, 4095, 4096, 4097, UINT64_MAX,
                                 UINT64_MAX - 1, uint64_t{1} << 63});
    uint64_t sum = 0;
    for (const DeviceInfo& d : devices_) {
      edges_.insert(edges_.end(), {d.total_bytes - 1, d.total_bytes, d.total_bytes + 1,
                                   d.total_bytes / 2, d.total_bytes / 4});
      sum += d.total_bytes;
    }
    edges_.insert(edges_.end(), {sum, sum + 1});
  }

  uint64_t Next() { return rng_(); }
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  bool OneIn(uint64_t n) { return Below(n) == 0; }

  uint64_t Size() {
    switch (Below(4)) {
      case 0: return edges_[Below(edges_.size())];
      case 1: return 1 + Below(64 * 1024);
      case 2: return 1 + Below(16 * kMiB);
      default: return 1 + Below(64 * kMiB);
    }
  }

  uint64_t Alignment() {
    switch (Below(8)) {
      case 0: return 0;
      case 1: return Below(1 << 20);              // mostly not a power of two
      case 2: return uint64_t{1} << Below(64);     // any power of two
      case 3: return edges_[Below(edges_.size())];
      case 4: return UINT64_MAX;
      default: return uint64_t{1} << Below(21);   // 1 .. 1 MiB
    }
  }

  std::string Selector() {
    const size_t n = devices_.size();
    switch (Below(16)) {
      case 0: case 1: case 2: case 3: return std::to_string(Below(n));
      case 4: return std::to_string(n + Below(5));  // out of range
      case 5: return devices_[Below(n)].uuid;
      case 6: return absl::AsciiStrToUpper(devices_[Below(n)].uuid);
      case 7: {
        std::string u = devices_[Below(n)].uuid;
        u[4 + Below(u.size() - 4)] ^= 0x01;  // invalid UUID, one bit off
        return u;
      }
      case 8: return OneIn(2) ? "all" : "ALL";
      case 9: return "";
      case 10: return "-1";
      case 11: return "18446744073709551617";
      case 12: return OneIn(2) ? " 1" : "01";
      case 13: return "GPU-";
      case 14: {
        std::string s(Below(12), '\0');
        for (char& c : s) c = static_cast<char>(Next());
        return s;
      }
      default: return "garbage";
    }
  }

  void Selectors(google::protobuf::RepeatedPtrField<std::string>* out) {
    const int count = OneIn(2) ? 0 : static_cast<int>(Below(4));
    for (int i = 0; i < count; ++i) *out->Add() = Selector();
  }

  AllocateRequest Request() {
    AllocateRequest r;
    if (!OneIn(10)) r.set_size_bytes(Size());
    if (OneIn(2)) r.set_alignment(Alignment());
    if (OneIn(4)) r.set_shard_count(static_cast<uint32_t>(Below(11)));
    if (OneIn(5)) {
      const int n = static_cast<int>(Below(7));
      uint64_t sum = 0;
      for (int i = 0; i < n; ++i) {
        const uint64_t s = OneIn(3) ? edges_[Below(edges_.size())] : 1 + Below(8 * kMiB);
        r.add_shard_sizes(s);
        sum += s;
      }
      if (OneIn(2)) r.set_size_bytes(sum);            // consistent (may wrap)
      if (OneIn(2)) r.set_shard_count(static_cast<uint32_t>(n));
    }
    if (!OneIn(3)) {
      PlacementRequest* p = r.mutable_placement();
      Selectors(p->mutable_devices());
      if (OneIn(3)) Selectors(p->mutable_exclude());
      if (OneIn(3)) {
        const int sets = static_cast<int>(Below(3));
        for (int i = 0; i < sets; ++i) Selectors(p->add_fallback()->mutable_devices());
      }
      if (OneIn(3)) p->set_policy(static_cast<PlacementRequest::Policy>(Below(5)));
      if (OneIn(4)) p->set_near(Selector());
    }
    return r;
  }

  // Random bytes, or a mutated valid request.
  std::string Bytes() {
    std::string s;
    if (OneIn(2)) {
      s.resize(Below(48));
      for (char& c : s) c = static_cast<char>(Next());
      return s;
    }
    s = Request().SerializeAsString();
    const int edits = 1 + static_cast<int>(Below(4));
    for (int i = 0; i < edits && !s.empty(); ++i) {
      const size_t at = Below(s.size());
      switch (Below(3)) {
        case 0: s[at] = static_cast<char>(Next()); break;
        case 1: s.erase(at, 1); break;
        default: s.insert(at, 1, static_cast<char>(Next())); break;
      }
    }
    return s;
  }

 private:
  std::mt19937_64 rng_;
  std::vector<DeviceInfo> devices_;
  std::vector<uint64_t> edges_;
};

// The devices a selector names, or nullopt when this test does not know
// (the broker is then only checked for a valid device).
std::optional<std::set<uint32_t>> Resolve(const std::string& sel,
                                          const std::vector<DeviceInfo>& devices) {
  std::set<uint32_t> all;
  for (const DeviceInfo& d : devices) all.insert(d.index);
  if (absl::EqualsIgnoreCase(sel, "all")) return all;
  bool digits = !sel.empty();
  for (char c : sel) digits &= absl::ascii_isdigit(static_cast<unsigned char>(c));
  if (digits) {
    uint64_t i;
    if (absl::SimpleAtoi(sel, &i) && i < devices.size()) {
      return std::set<uint32_t>{static_cast<uint32_t>(i)};
    }
    return std::nullopt;
  }
  for (const DeviceInfo& d : devices) {
    if (absl::EqualsIgnoreCase(sel, d.uuid)) return std::set<uint32_t>{d.index};
  }
  return std::nullopt;
}

std::optional<std::set<uint32_t>> Allowed(const AllocateRequest& r,
                                          const std::vector<DeviceInfo>& devices) {
  std::set<uint32_t> all;
  for (const DeviceInfo& d : devices) all.insert(d.index);
  auto set_of = [&](const google::protobuf::RepeatedPtrField<std::string>& sels)
      -> std::optional<std::set<uint32_t>> {
    if (sels.empty()) return all;
    std::set<uint32_t> out;
    for (const std::string& s : sels) {
      std::optional<std::set<uint32_t>> one = Resolve(s, devices);
      if (!one) return std::nullopt;
      out.insert(one->begin(), one->end());
    }
    return out;
  };
  const PlacementRequest& p = r.placement();
  std::optional<std::set<uint32_t>> allowed = set_of(p.devices());
  if (!allowed) return std::nullopt;
  for (const auto& fb : p.fallback()) {
    std::optional<std::set<uint32_t>> more = set_of(fb.devices());
    if (!more) return std::nullopt;
    allowed->insert(more->begin(), more->end());
  }
  for (const std::string& s : p.exclude()) {
    std::optional<std::set<uint32_t>> ex = Resolve(s, devices);
    if (!ex) return std::nullopt;
    for (uint32_t d : *ex) allowed->erase(d);
  }
  return allowed;
}

// The block sizes an OK response to `r` must have, in order.
std::vector<uint64_t> ExpectedSizes(const AllocateRequest& r) {
  if (r.shard_sizes_size() > 0) {
    return std::vector<uint64_t>(r.shard_sizes().begin(), r.shard_sizes().end());
  }
  if (r.shard_count() == 0) return {r.size_bytes()};
  std::vector<uint64_t> sizes(r.shard_count(), r.size_bytes() / r.shard_count());
  sizes.back() += r.size_bytes() % r.shard_count();
  return sizes;
}

bool Allowed(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kFailedPrecondition:
      return true;
    default:
      return false;
  }
}

struct LiveBlock {
  uint32_t device;
  uint64_t size;
  uint64_t slab_id;
  uint64_t slab_size;
};

class RequestFuzzTest : public ::testing::Test {
 protected:
  RequestFuzzTest()
      : backend_({64 * kMiB, 100 * kMiB + 12288, 128 * kMiB, 48 * kMiB}) {
    BrokerOptions o;
    o.pool.slab_size = 8 * kMiB;
    o.pool.granularity = 4096;
    o.pool.empty_release_after = absl::Milliseconds(50);
    o.maintenance_interval = absl::Milliseconds(20);
    broker_ = std::make_unique<MemoryBroker>(&backend_, o);
  }

  void SetUp() override { ASSERT_TRUE(broker_->Start().ok()); }

  // Checks one Allocate against the request and records its blocks.
  void CheckAllocate(const AllocateRequest& r, const PeerCred& caller,
                     const std::string& what) {
    absl::StatusOr<AllocateResponse> res = broker_->AllocateAndWait(caller, r);
    if (!res.ok()) {
      ++errors_[res.status().code()];
      EXPECT_TRUE(Allowed(res.status().code()))
          << what << ": " << r.ShortDebugString() << " -> " << res.status();
      if (caller.pid <= 0) {
        // Only size checks may precede the identity check.
        EXPECT_TRUE(absl::IsPermissionDenied(res.status()) ||
                    absl::IsInvalidArgument(res.status()))
            << res.status();
      }
      return;
    }
    ++ok_allocs_;
    EXPECT_GT(caller.pid, 0) << "a caller without pid got memory";
    const std::vector<uint64_t> sizes = ExpectedSizes(r);
    ASSERT_EQ(static_cast<size_t>(res->allocations_size()), sizes.size())
        << what << ": " << r.ShortDebugString();
    const uint64_t align = r.alignment() == 0 ? kDefaultAlignment : r.alignment();
    const std::optional<std::set<uint32_t>> allowed = Allowed(r, backend_.devices());
    std::set<uint32_t> used_devices;
    for (int i = 0; i < res->allocations_size(); ++i) {
      const v1::Allocation& a = res->allocations(i);
      SCOPED_TRACE(absl::StrCat(what, ": ", r.ShortDebugString(), " -> ",
                                a.ShortDebugString()));
      ASSERT_LT(a.device_index(), backend_.devices().size());
      const DeviceInfo& d = backend_.devices()[a.device_index()];
      EXPECT_EQ(a.device_uuid(), d.uuid);
      EXPECT_EQ(a.size_bytes(), sizes[i]);
      EXPECT_GT(a.size_bytes(), 0u);
      EXPECT_LE(a.size_bytes(), d.total_bytes);
      EXPECT_LE(a.slab_size_bytes(), d.total_bytes);
      EXPECT_LE(a.offset(), a.slab_size_bytes());
      EXPECT_LE(a.size_bytes(), a.slab_size_bytes() - a.offset());
      EXPECT_EQ(a.offset() % align, 0u) << "alignment " << align;
      EXPECT_NE(a.id(), 0u);
      EXPECT_EQ(live_.count(a.id()), 0u) << "id reused while live";
      if (allowed) {
        EXPECT_TRUE(allowed->count(a.device_index()))
            << "device " << a.device_index() << " outside the named sets";
      }
      auto slab = slab_device_.find(a.slab_id());
      if (slab != slab_device_.end()) {
        EXPECT_EQ(slab->second, a.device_index()) << "slab id on two devices";
      }
      slab_device_[a.slab_id()] = a.device_index();
      used_devices.insert(a.device_index());
      live_[a.id()] = LiveBlock{a.device_index(), a.size_bytes(), a.slab_id(),
                                a.slab_size_bytes()};
    }
    EXPECT_EQ(used_devices.size(), sizes.size())
        << "shards share a device: " << res->ShortDebugString();
  }

  void CheckFree(uint64_t id, const PeerCred& caller, bool foreign) {
    absl::StatusOr<v1::FreeResponse> f = broker_->Free(caller, FreeRequest(id));
    auto it = live_.find(id);
    if (id == 0) {
      EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
    } else if (it == live_.end()) {
      EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound)
          << id << ": " << f.status();
    } else if (foreign) {
      // Another user's allocation answers as one that does not exist.
      EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound) << f.status();
    } else {
      ASSERT_TRUE(f.ok()) << id << ": " << f.status();
      EXPECT_EQ(f->freed_bytes(), it->second.size);
      freed_.push_back(id);
      live_.erase(it);
    }
  }

  static v1::FreeRequest FreeRequest(uint64_t id) {
    v1::FreeRequest r;
    r.set_id(id);
    return r;
  }

  void CheckStats(int iter) {
    // The maintenance thread's idle sweep takes an empty slab off the pool's
    // books before the backend has its memory back (the backend call runs
    // after the pool's lock is dropped), and the pool counts that memory as
    // held until then. Only that thread gives slabs back while this one
    // reads, so what the backend held before the stats bounds them.
    std::vector<uint64_t> held_before;
    for (const DeviceInfo& d : backend_.devices()) held_before.push_back(backend_.SlabBytes(d.index));
    v1::GetStatsResponse s = StatsOf(*broker_, PeerCred{getpid(), 0, 0});
    std::map<uint32_t, uint64_t> used, count;
    for (const auto& [id, b] : live_) {
      used[b.device] += b.size;
      ++count[b.device];
    }
    ASSERT_EQ(s.devices_size(), static_cast<int>(backend_.devices().size()));
    for (const auto& d : s.devices()) {
      EXPECT_EQ(d.used_bytes(), used[d.index()]) << "iteration " << iter;
      EXPECT_EQ(d.allocation_count(), count[d.index()]) << "iteration " << iter;
      EXPECT_LE(d.pooled_bytes() + d.retained_bytes(), d.total_bytes());
      EXPECT_LE(d.used_bytes(), d.pooled_bytes());
      // Free: what a tenant holding nothing there could get: at least what
      // no slab holds, never what live blocks or retained slabs hold.
      const uint64_t held = held_before[d.index()];
      EXPECT_LE(d.pooled_bytes() + d.retained_bytes(), held) << "iteration " << iter;
      EXPECT_GE(d.free_bytes(), std::min(d.total_bytes() - d.pooled_bytes() - d.retained_bytes(),
                                         (d.total_bytes() - held) / 4096 * 4096))
          << "iteration " << iter;
      EXPECT_LE(d.free_bytes(), d.total_bytes() - d.used_bytes() - d.retained_bytes());
      EXPECT_GE(d.fragmentation(), 0.0);
      EXPECT_LE(d.fragmentation(), 1.0);
      EXPECT_LE(backend_.SlabBytes(d.index()), d.total_bytes());
    }
  }

  SimBackend backend_;
  std::unique_ptr<MemoryBroker> broker_;
  std::map<uint64_t, LiveBlock> live_;
  std::vector<uint64_t> freed_;
  std::map<uint64_t, uint32_t> slab_device_;
  std::map<absl::StatusCode, int> errors_;
  int ok_allocs_ = 0;
};

TEST_F(RequestFuzzTest, RandomRequestsKeepTheBrokerConsistent) {
  const int iters = EnvInt("GPUMEMD_FUZZ_ITERS", kDefaultIters);
  const uint64_t seed = static_cast<uint64_t>(EnvInt("GPUMEMD_FUZZ_SEED", 20240601));
  RequestFuzzer fz(seed, backend_.devices());
  const PeerCred self{getpid(), getuid(), getgid()};
  const uid_t other_uid = getuid() == 4242 ? 4243 : 4242;
  const PeerCred foreign{getpid(), other_uid, other_uid};  // not root
  const PeerCred nopid{0, getuid(), getgid()};
  int parsed = 0;

  for (int iter = 0; iter < iters && !HasFatalFailure(); ++iter) {
    const uint64_t op = fz.Below(100);
    if (op < 45) {
      CheckAllocate(fz.Request(), fz.OneIn(50) ? nopid : self,
                    absl::StrCat("iteration ", iter));
    } else if (op < 55) {
      AllocateRequest r;
      if (r.ParseFromString(fz.Bytes())) {
        ++parsed;
        CheckAllocate(r, self, absl::StrCat("iteration ", iter, " (parsed)"));
      }
    } else if (op < 90) {
      uint64_t id;
      bool is_foreign = false;
      const uint64_t pick = fz.Below(20);
      if (pick < 13 && !live_.empty()) {
        auto it = live_.begin();
        std::advance(it, fz.Below(std::min<size_t>(live_.size(), 64)));
        id = it->first;
        is_foreign = pick == 0;
      } else if (pick < 15 && !freed_.empty()) {
        id = freed_[fz.Below(freed_.size())];
      } else if (pick < 17) {
        id = fz.Next();
      } else if (pick < 18) {
        id = 0;
      } else if (pick < 19) {
        id = UINT64_MAX;
      } else {
        id = fz.Below(1000);
      }
      CheckFree(id, is_foreign ? foreign : self, is_foreign);
    } else if (op < 97) {
      // Slab handles: a slab we hold a block in, or a random id.
      if (!live_.empty() && fz.OneIn(2)) {
        auto it = live_.begin();
        std::advance(it, fz.Below(std::min<size_t>(live_.size(), 64)));
        absl::StatusOr<SlabFd> fd = broker_->ExportSlab(self, it->second.slab_id);
        ASSERT_TRUE(fd.ok()) << fd.status();
        EXPECT_EQ(fd->size, it->second.slab_size);
        struct stat st;
        EXPECT_EQ(fstat(fd->fd, &st), 0);
        EXPECT_EQ(static_cast<uint64_t>(st.st_size), it->second.slab_size);
        close(fd->fd);
        // Like the client library: closed, so the slab need not be retained.
        EXPECT_TRUE(broker_->CloseSlab(self, it->second.slab_id).ok());
        absl::StatusOr<SlabFd> denied = broker_->ExportSlab(foreign, it->second.slab_id);
        // Another tenant's slab answers as one that does not exist.
        EXPECT_EQ(denied.status().code(), absl::StatusCode::kNotFound);
        if (denied.ok()) close(denied->fd);
      } else {
        const uint64_t slab = fz.Next() % 100000;
        absl::StatusOr<SlabFd> fd = broker_->ExportSlab(self, slab);
        if (fd.ok()) {
          close(fd->fd);
          EXPECT_TRUE(broker_->CloseSlab(self, slab).ok());
        } else {
          EXPECT_TRUE(Allowed(fd.status().code())) << fd.status();
        }
      }
    } else {
      CheckStats(iter);
    }
  }
  CheckStats(iters);

  // Free everything; nothing may stay used.
  while (!live_.empty()) CheckFree(live_.begin()->first, self, false);
  v1::GetStatsResponse s = StatsOf(*broker_, PeerCred{getpid(), 0, 0});
  for (const auto& d : s.devices()) {
    EXPECT_EQ(d.used_bytes(), 0u) << "device " << d.index();
    EXPECT_EQ(d.allocation_count(), 0u) << "device " << d.index();
  }
  for (const auto& ss : s.sessions()) {
    EXPECT_EQ(ss.allocation_count(), 0u);
    EXPECT_EQ(ss.used_bytes(), 0u);
  }
  // The run reached both outcomes, not just argument errors.
  EXPECT_GT(ok_allocs_, iters / 20);
  EXPECT_GT(errors_[absl::StatusCode::kInvalidArgument], iters / 50);
  EXPECT_GT(errors_[absl::StatusCode::kResourceExhausted], 0);
  EXPECT_GT(parsed, 0);
  std::string summary = absl::StrCat(iters, " iterations, ", ok_allocs_,
                                     " allocations, ", parsed, " parsed requests;");
  for (const auto& [code, n] : errors_) {
    absl::StrAppend(&summary, " ", absl::StatusCodeToString(code), "=", n);
  }
  std::cout << summary << std::endl;
  broker_->Shutdown();
  for (const DeviceInfo& d : backend_.devices()) {
    EXPECT_EQ(backend_.SlabBytes(d.index), 0u);
  }
}

}  // namespace
}  // namespace gpumem
