// soak_client: the client processes of the chaos soak (chaos_soak.cc) and of
// the pressure tests. One mode per run; every line is flushed at once so the
// parent can follow along even when it SIGKILLs the process.
//
//   --mode=worker --seed=N [--ops_per_sec=R] [--restart=survive|close]
//       Until killed: random requests through both client paths (the C ABI's
//       caching pool for small blocks, C++ Client Buffers for large ones,
//       raw requests with wait_ms, never mapped), random sizes, placements,
//       shards and lifetimes; each mapped block is filled with a pattern and
//       checked when it is freed. Prints "stats ops=.. allocs=.. refused=..
//       waited=.. lost=.. errors=.. corrupt=.. restarts=.. generation=..
//       lost_bytes=.. connect_failures=.. cxx=.." every second (restarts:
//       the C++ Client's, generation: the C ABI pool's, 1 + its restarts;
//       lost_bytes: what the pool says it lost; connect_failures: new C++
//       Clients refused while the daemon was down; cxx: 1 while it has a
//       C++ Client), "ERROR ..." for a status no request should get,
//       "CORRUPT ..." for a block whose bytes changed.
//       --restart=survive (the default): a daemon restart loses nothing the
//       process has mapped: calls made meanwhile wait and go to the new
//       daemon, every block frees normally. Any UNAVAILABLE, CANCELLED, a
//       lost block of the pool, or a mapped Buffer whose Free answers
//       NOT_FOUND is an ERROR. Only a raw block (never mapped: no fd of its
//       slab here to give back) may be gone: its Free's NOT_FOUND is counted
//       as lost (the soak checks, from the ledger, why it was closed).
//       --restart=close: a restart costs it its memory (UNAVAILABLE, then
//       NOT_FOUND or GPUMEM_E_LOST): counted as lost, then it goes on.
//   --mode=attack --size=BYTES
//       Allocates a block, fetches its slab's fd over the slab channel and
//       tries to change the slab: shrink (ftruncate to 0), grow (ftruncate
//       to 1 TiB and to one page more), fallocate past the end, and a seal
//       of its own (F_SEAL_WRITE). Prints "attack shrink=E grow=E grow1=E
//       fallocate=E seal=E size=S" (E: the errno name, or "ok"), then
//       "VIOLATION ..." if any of them worked or the size changed, then
//       frees the block but keeps the fd and its mapping (the slab stays
//       retained) and prints "ready"; retries the attacks every second
//       until killed.
//   --mode=idle_leases --bytes=N --block=B
//       The C ABI's caching pool (GPUMEM_LEASE_SIZE etc. from the
//       environment) allocates N bytes in blocks of B and frees them all:
//       the leases stay cached, idle. Prints "ready", then sleeps; the
//       library answers the daemon's reclaims.
//   --mode=mute --bytes=N --block=B
//       Allocates N bytes in blocks of B on its stream, reporting all of it
//       as idle leases, and never answers a reclaim. Prints "ready", sleeps.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/lib/cpp/client.h"
#include "client/lib/include/gpumem.h"
#include "common/fd_channel.h"

ABSL_FLAG(std::string, socket, "", "daemon socket");
ABSL_FLAG(std::string, mode, "worker", "worker | attack | idle_leases | mute");
ABSL_FLAG(uint64_t, seed, 1, "worker: random seed");
ABSL_FLAG(double, ops_per_sec, 200, "worker: requests per second at most");
ABSL_FLAG(uint64_t, size, 1 << 20, "attack: block size");
ABSL_FLAG(uint64_t, bytes, 0, "idle_leases, mute: bytes to hold");
ABSL_FLAG(uint64_t, block, 1 << 20, "idle_leases, mute: block size");
ABSL_FLAG(std::string, restart, "survive",
          "worker: survive (a daemon restart loses nothing mapped) | close (it ends "
          "every allocation)");

namespace gpumem {
namespace {

using client::Buffer;
using client::Client;

void Say(const std::string& line) {
  printf("%s\n", line.c_str());
  fflush(stdout);
}

std::string ErrnoName(int rc) {
  if (rc == 0) return "ok";
  switch (errno) {
    case EPERM: return "EPERM";
    case EBUSY: return "EBUSY";
    case EINVAL: return "EINVAL";
    case EFBIG: return "EFBIG";
    case ENOSPC: return "ENOSPC";
    default: return absl::StrCat("errno", errno);
  }
}

uint8_t Pattern(uint64_t key) { return static_cast<uint8_t>((key * 0x9E3779B97F4A7C15ull) >> 56) | 1; }

// Fills the first and last 64 bytes (or all of a smaller block).
void Fill(void* p, uint64_t n, uint8_t v) {
  const uint64_t k = std::min<uint64_t>(n, 64);
  memset(p, v, k);
  memset(static_cast<char*>(p) + n - k, v, k);
}
bool Intact(const void* p, uint64_t n, uint8_t v) {
  const uint64_t k = std::min<uint64_t>(n, 64);
  const auto* b = static_cast<const uint8_t*>(p);
  for (uint64_t i = 0; i < k; ++i) {
    if (b[i] != v || b[n - 1 - i] != v) return false;
  }
  return true;
}

class Worker {
 public:
  Worker(std::string socket, uint64_t seed)
      : socket_(std::move(socket)),
        rng_(seed),
        survive_(absl::GetFlag(FLAGS_restart) != "close") {}

  int Run() {
    c_ = gpumem_connect(socket_.c_str());
    if (c_ == nullptr) {
      Say(absl::StrCat("ERROR connect ", gpumem_last_error_message()));
      return 1;
    }
    const absl::Duration pace = absl::Seconds(1.0 / absl::GetFlag(FLAGS_ops_per_sec));
    absl::Time next_stats = absl::Now() + absl::Seconds(1);
    for (;;) {
      Step();
      MaybeDrop();
      FreeExpired(absl::Now());
      MaybeDrop();
      if (absl::Now() >= next_stats) {
        int64_t generation = 0, lost_bytes = 0;
        PoolFigures(&generation, &lost_bytes);
        if (survive_ && lost_bytes > 0 && !said_pool_lost_) {
          said_pool_lost_ = true;
          ++errors_;
          Say(absl::StrCat("ERROR the C ABI pool lost ", lost_bytes,
                           " bytes at a daemon restart"));
        }
        Say(absl::StrCat("stats ops=", ops_, " allocs=", allocs_, " refused=", refused_,
                         " waited=", waited_, " lost=", lost_, " errors=", errors_,
                         " corrupt=", corrupt_, " restarts=",
                         cxx_ != nullptr ? cxx_->restarts() + cxx_restarts_before_
                                         : cxx_restarts_before_,
                         " generation=", generation, " lost_bytes=", lost_bytes,
                         " connect_failures=", connect_failures_,
                         " cxx=", cxx_ != nullptr ? 1 : 0));
        next_stats += absl::Seconds(1);
      }
      absl::SleepFor(pace);
    }
  }

 private:
  struct Small {
    void* p;
    uint64_t n;
    uint8_t v;
    absl::Time until;
  };
  struct Large {
    Buffer b;
    uint8_t v;
    absl::Time until;
  };
  struct Raw {
    uint64_t id;
    absl::Time until;
  };

  absl::Time Lifetime(double max_s) {
    return absl::Now() +
           absl::Seconds(std::uniform_real_distribution<double>(0, max_s)(rng_));
  }
  int Pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }

  // The C ABI pool's "generation" and "lost_bytes" (gpumem_stats_json).
  void PoolFigures(int64_t* generation, int64_t* lost_bytes) {
    char* json = nullptr;
    if (gpumem_stats_json(c_, &json) != GPUMEM_OK) return;
    const std::string s(json);
    gpumem_string_free(json);
    auto field = [&s](const std::string& name) -> int64_t {
      const size_t at = s.find("\"" + name + "\":");
      return at == std::string::npos ? -1 : std::atoll(s.c_str() + at + name.size() + 3);
    };
    *generation = field("generation");
    *lost_bytes = field("lost_bytes");
  }

  // Codes an allocation may get under chaos; anything else is an error.
  // With survive_, a restart must cost nothing: its codes are errors too.
  void Counted(int rc, const std::string& what) {
    if (rc == GPUMEM_E_RESOURCE_EXHAUSTED) {
      ++refused_;
    } else if (!survive_ && (rc == GPUMEM_E_UNAVAILABLE || rc == GPUMEM_E_LOST)) {
      ++lost_;
    } else if (rc != GPUMEM_OK) {
      ++errors_;
      Say(absl::StrCat("ERROR ", what, " code ", rc, ": ", gpumem_last_error_message()));
    }
  }
  void Counted(const absl::Status& s, const std::string& what) {
    using absl::StatusCode;
    if (s.code() == StatusCode::kResourceExhausted) {
      ++refused_;
    } else if (!survive_ && (s.code() == StatusCode::kUnavailable ||
                             s.code() == StatusCode::kNotFound ||
                             s.code() == StatusCode::kCancelled)) {
      ++lost_;  // the daemon restarted (or is restarting)
      drop_ = true;
    } else if (!s.ok()) {
      ++errors_;
      Say(absl::StrCat("ERROR ", what, " ", s.ToString()));
    }
  }

  Client* Cxx() {
    if (cxx_ == nullptr) {
      absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(socket_);
      if (!c.ok()) {
        // A new connection while the daemon is down fails (nothing waits
        // for a daemon before the first one): not a loss.
        if (survive_) {
          ++connect_failures_;
        } else {
          ++lost_;
        }
        return nullptr;
      }
      cxx_ = *std::move(c);
    }
    return cxx_.get();
  }

  // After a daemon restart: the old connection's Buffers are forgotten
  // (their ids mean nothing to the new daemon), then the connection.
  void MaybeDrop() {
    if (!drop_) return;
    drop_ = false;
    for (Large& l : large_) l.b.Abandon();
    large_.clear();
    raw_.clear();
    if (cxx_ != nullptr) cxx_restarts_before_ += cxx_->restarts();
    cxx_.reset();
  }

  void Step() {
    ++ops_;
    static const char* kPlacements[] = {"", "--gpus=0", "--gpus=1", "--gpus=1 --fallback=0",
                                        "--policy=pack", "--exclude=0", "--gpus=all"};
    switch (Pick(8)) {
      case 0:
      case 1:
      case 2: {  // small, from leases
        const uint64_t n = 256 + Pick(256 * 1024);
        void* p = nullptr;
        const int rc = gpumem_malloc_str(c_, n, kPlacements[Pick(7)], &p);
        Counted(rc, "malloc");
        if (rc == GPUMEM_OK) {
          ++allocs_;
          const uint8_t v = Pattern(reinterpret_cast<uintptr_t>(p) ^ ops_);
          Fill(p, n, v);
          small_.push_back({p, n, v, Lifetime(2)});
        }
        break;
      }
      case 3: {  // sharded, from the daemon
        void* ptrs[2] = {};
        size_t sizes[2] = {};
        const int rc = gpumem_malloc_sharded(c_, (1 + Pick(16)) << 20, 2, nullptr, ptrs,
                                             sizes, nullptr);
        Counted(rc, "sharded");
        if (rc == GPUMEM_OK) {
          ++allocs_;
          for (int i = 0; i < 2; ++i) {
            const uint8_t v = Pattern(reinterpret_cast<uintptr_t>(ptrs[i]));
            Fill(ptrs[i], sizes[i], v);
            small_.push_back({ptrs[i], sizes[i], v, Lifetime(3)});
          }
        }
        break;
      }
      case 4:
      case 5: {  // large Buffers on the stream
        Client* c = Cxx();
        if (c == nullptr) break;
        v1::PlacementRequest where;
        if (Pick(2) == 0) where.add_devices(std::to_string(Pick(2)));
        absl::StatusOr<Buffer> b = c->Allocate((1 + Pick(48)) << 20, where);
        Counted(b.status(), "allocate");
        if (b.ok()) {
          ++allocs_;
          const uint8_t v = Pattern(b->id());
          Fill(b->data(), b->size(), v);
          large_.push_back({*std::move(b), v, Lifetime(5)});
        }
        break;
      }
      case 6: {  // raw, waiting up to half a second
        Client* c = Cxx();
        if (c == nullptr) break;
        v1::AllocateRequest r;
        r.set_size_bytes(static_cast<uint64_t>(8 + Pick(120)) << 20);
        r.set_wait_ms(10 + Pick(500));
        absl::StatusOr<v1::AllocateResponse> a = c->AllocateRaw(r);
        ++waited_;
        Counted(a.status(), "allocate_raw");
        if (a.ok()) {
          ++allocs_;
          raw_.push_back({a->allocations(0).id(), Lifetime(4)});
        }
        break;
      }
      case 7:
        if (Pick(20) == 0) gpumem_trim(c_, nullptr);
        break;
    }
  }

  void FreeExpired(absl::Time now) {
    for (size_t i = 0; i < small_.size();) {
      Small& s = small_[i];
      if (s.until > now) {
        ++i;
        continue;
      }
      if (!Intact(s.p, s.n, s.v)) {
        ++corrupt_;
        Say(absl::StrCat("CORRUPT small block ", reinterpret_cast<uintptr_t>(s.p), " of ", s.n));
      }
      const int rc = gpumem_free(c_, s.p);
      // Close mode: a block from before a restart is gone (the pool says
      // LOST, or, for a large block whose loss it had not applied yet, the
      // daemon's NOT_FOUND "did not survive the restart").
      const bool gone = rc == GPUMEM_E_LOST ||
                        (rc == GPUMEM_E_NOT_FOUND &&
                         strstr(gpumem_last_error_message(), "did not survive the restart"));
      if (rc != GPUMEM_OK && (survive_ || !gone)) Counted(rc, "free");
      s = small_.back();
      small_.pop_back();
    }
    for (size_t i = 0; i < large_.size();) {
      Large& l = large_[i];
      if (l.until > now) {
        ++i;
        continue;
      }
      if (!Intact(l.b.data(), l.b.size(), l.v)) {
        ++corrupt_;
        Say(absl::StrCat("CORRUPT buffer ", l.b.id(), " of ", l.b.size()));
      }
      Counted(l.b.Free(), "free");
      l = std::move(large_.back());
      large_.pop_back();
    }
    for (size_t i = 0; i < raw_.size();) {
      if (raw_[i].until > now) {
        ++i;
        continue;
      }
      if (Client* c = Cxx()) {
        const absl::Status freed = c->Free(raw_[i].id);
        if (survive_ && freed.code() == absl::StatusCode::kNotFound) {
          ++lost_;  // closed at a restart: nobody here had its slab open
        } else {
          Counted(freed, "free_raw");
        }
      }
      raw_[i] = raw_.back();
      raw_.pop_back();
    }
  }

  const std::string socket_;
  std::mt19937_64 rng_;
  gpumem_client* c_ = nullptr;
  std::unique_ptr<Client> cxx_;
  bool drop_ = false;
  const bool survive_;
  bool said_pool_lost_ = false;
  uint64_t cxx_restarts_before_ = 0;  // restarts of C++ Clients dropped
  uint64_t connect_failures_ = 0;
  std::vector<Small> small_;
  std::vector<Large> large_;
  std::vector<Raw> raw_;
  uint64_t ops_ = 0, allocs_ = 0, refused_ = 0, waited_ = 0, lost_ = 0, errors_ = 0,
           corrupt_ = 0;
};

int Attack(const std::string& socket) {
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(socket);
  if (!c.ok()) {
    Say("ERROR connect " + c.status().ToString());
    return 1;
  }
  v1::AllocateRequest r;
  r.set_size_bytes(absl::GetFlag(FLAGS_size));
  absl::StatusOr<v1::AllocateResponse> a = (*c)->AllocateRaw(r);
  if (!a.ok()) {
    Say("refused " + a.status().ToString());
    for (;;) pause();
  }
  const v1::Allocation& block = a->allocations(0);
  absl::StatusOr<int> ch = ConnectFdChannel(socket);
  absl::StatusOr<SlabFd> slab = ch.ok() ? RequestSlabFd(*ch, block.slab_id())
                                        : absl::StatusOr<SlabFd>(ch.status());
  if (!slab.ok()) {
    Say("ERROR slab " + slab.status().ToString());
    return 1;
  }
  void* map = mmap(nullptr, slab->size, PROT_READ | PROT_WRITE, MAP_SHARED, slab->fd, 0);
  auto attack = [&](bool print) {
    const std::string shrink = ErrnoName(ftruncate(slab->fd, 0));
    const std::string grow = ErrnoName(ftruncate(slab->fd, off_t{1} << 40));
    const std::string grow1 =
        ErrnoName(ftruncate(slab->fd, static_cast<off_t>(slab->size + 4096)));
    const std::string falloc =
        ErrnoName(fallocate(slab->fd, 0, static_cast<off_t>(slab->size), 1 << 20));
    const std::string seal = ErrnoName(fcntl(slab->fd, F_ADD_SEALS, F_SEAL_WRITE) < 0 ? -1 : 0);
    struct stat st;
    fstat(slab->fd, &st);
    if (print) {
      Say(absl::StrCat("attack shrink=", shrink, " grow=", grow, " grow1=", grow1,
                       " fallocate=", falloc, " seal=", seal, " size=", st.st_size));
    }
    if (shrink == "ok" || grow == "ok" || grow1 == "ok" || falloc == "ok" || seal == "ok" ||
        static_cast<uint64_t>(st.st_size) != slab->size) {
      Say(absl::StrCat("VIOLATION slab ", block.slab_id(), " changed: size ", st.st_size,
                       " of ", slab->size));
    }
  };
  attack(true);
  // Its mapping still works: the last byte of its own block is writable
  // (the rest of the slab may be other blocks of its tenant).
  if (map != MAP_FAILED) {
    static_cast<volatile char*>(map)[block.offset() + block.size_bytes() - 1] = 1;
  }
  // Keeps the fd and the mapping after the block is freed: the slab stays
  // retained for this process until it dies.
  (void)(*c)->Free(block.id());
  Say("ready");
  for (;;) {
    absl::SleepFor(absl::Seconds(1));
    attack(false);
  }
}

int IdleLeases(const std::string& socket) {
  gpumem_client* c = gpumem_connect(socket.c_str());
  if (c == nullptr) {
    Say(absl::StrCat("ERROR connect ", gpumem_last_error_message()));
    return 1;
  }
  const uint64_t block = absl::GetFlag(FLAGS_block);
  std::vector<void*> blocks;
  for (uint64_t held = 0; held < absl::GetFlag(FLAGS_bytes); held += block) {
    void* p = nullptr;
    if (gpumem_malloc(c, block, nullptr, &p) != GPUMEM_OK) {
      Say(absl::StrCat("ERROR malloc ", gpumem_last_error_message()));
      return 1;
    }
    blocks.push_back(p);
  }
  for (void* p : blocks) gpumem_free(c, p);
  char* json = nullptr;
  if (gpumem_stats_json(c, &json) == GPUMEM_OK) {
    const std::string s(json);
    Say("pool " + s.substr(0, s.find(",\"lease_rows\"")) + "}");
    gpumem_string_free(json);
  }
  Say("ready");
  for (;;) pause();
}

int Mute(const std::string& socket) {
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(socket);
  if (!c.ok()) {
    Say("ERROR connect " + c.status().ToString());
    return 1;
  }
  const uint64_t total = absl::GetFlag(FLAGS_bytes), block = absl::GetFlag(FLAGS_block);
  v1::UsageReport idle;
  idle.set_leased_bytes(total);
  idle.set_in_use_bytes(0);
  (*c)->SetUsageReport(idle);
  for (uint64_t held = 0; held < total; held += block) {
    v1::AllocateRequest r;
    r.set_size_bytes(block);
    *r.mutable_usage() = idle;
    absl::StatusOr<v1::AllocateResponse> a = (*c)->AllocateRaw(r);
    if (!a.ok()) {
      Say("ERROR allocate " + a.status().ToString());
      return 1;
    }
  }
  Say("ready");
  for (;;) pause();
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string socket = absl::GetFlag(FLAGS_socket);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "worker") return gpumem::Worker(socket, absl::GetFlag(FLAGS_seed)).Run();
  if (mode == "attack") return gpumem::Attack(socket);
  if (mode == "idle_leases") return gpumem::IdleLeases(socket);
  if (mode == "mute") return gpumem::Mute(socket);
  fprintf(stderr, "unknown --mode=%s\n", mode.c_str());
  return 2;
}
