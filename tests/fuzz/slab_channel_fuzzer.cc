// Fuzzes the slab-handle channel as the socket listener sees it
// (server/service/slab_channel.h): a connection's first bytes, then its
// request bytes in chunks of any size, answered by a real MemoryBroker over
// the sim backend that holds a few slabs.
//
// Input: byte 0 chooses the caller (bit 0: this process, whose pid the
// daemon sees, or a caller in another pid namespace, pid 0, which needs a
// hello for a session) and the chunk sizes (bits 1-6, 1..64 bytes) and
// whether sends fail (bit 7: every 5th); the rest is what the client sent.
// Checked for every input: answers are well formed (a 16-byte header and at
// most kFdChannelMaxMessage message bytes, exactly as long as they say); an
// fd comes with a successful open only, of the slab's size and sealed
// against shrinking and growing; a second fd only with a successful
// kOpenRing (an eventfd, beside a ring's memfd of a ring's size); a
// connection-bound session is ended with the connection and leaves no slab
// held by it, and no ring (a real RingTransport lends them).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "common/fd_channel.h"
#include "server/backend/sim_backend.h"
#include "server/core/memory_broker.h"
#include "common/ring/request_ring.h"
#include "server/service/ring_transport.h"
#include "server/service/slab_channel.h"
#include "server/service/worker_pool.h"

namespace gpumem {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

struct World {
  SimBackend backend{std::vector<uint64_t>{64 * kMiB, 64 * kMiB}};
  std::unique_ptr<MemoryBroker> broker;
  std::unique_ptr<WorkerPool> workers;
  std::unique_ptr<RingTransport> rings;
};

World* world = nullptr;

PeerCred Self() { return PeerCred{getpid(), getuid(), getgid()}; }

void Check(bool ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "slab_channel_fuzzer: %s\n", what);
    abort();
  }
}

// `in` (what the channel kept of its input) starts with a whole request:
// a header, and for kRebind the token that follows it (slab_id: its length;
// a length out of bounds closes the connection instead).
bool WholeRequestWaiting(const std::string& in) {
  if (in.size() < sizeof(SlabRequest)) return false;
  SlabRequest req;
  memcpy(&req, in.data(), sizeof(req));
  if (static_cast<SlabOp>(req.op) != SlabOp::kRebind) return true;
  return in.size() - sizeof(req) >= req.slab_id;
}

}  // namespace
}  // namespace gpumem

using namespace gpumem;  // NOLINT: the fuzzer entry points are global

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  world = new World;
  BrokerOptions o;
  o.pool.slab_size = kMiB;
  o.pool.granularity = 4096;
  world->broker = std::make_unique<MemoryBroker>(&world->backend, o);
  Check(world->broker->Start().ok(), "broker start");
  world->workers = std::make_unique<WorkerPool>(1);
  RingTransportOptions ring_options;
  ring_options.workers = 1;
  absl::StatusOr<std::unique_ptr<RingTransport>> rings = RingTransport::Create(
      world->broker.get(), world->workers.get(), nullptr, ring_options);
  Check(rings.ok(), "ring transport");
  world->rings = *std::move(rings);
  // Slabs 1.. for the inputs to open and close.
  for (int i = 0; i < 6; ++i) {
    v1::AllocateRequest r;
    r.set_size_bytes(i % 2 == 0 ? kMiB / 2 : 3 * kMiB);
    Check(world->broker->AllocateAndWait(Self(), r).ok(), "seed allocation");
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const char* bytes = reinterpret_cast<const char*>(data + 1);
  const size_t n = size - 1;
  MemoryBroker* broker = world->broker.get();

  // The listener peeks at up to 4 bytes first.
  const Preface preface = ClassifyPreface(bytes, n < 4 ? n : 4);
  if (n >= 4) Check(preface != Preface::kNeedMore, "4 bytes must decide");
  if (preface != Preface::kSlabChannel) return 0;

  SlabChannelConn conn;
  conn.cred = (mode & 1) ? Self() : PeerCred{0, getuid(), getgid()};
  const size_t chunk = 1 + ((mode >> 1) & 63);
  int sends = 0;
  auto send = [&](const SlabChannelReply& r) {
    Check(r.bytes.size() >= sizeof(SlabResponse), "short answer");
    SlabResponse resp;
    memcpy(&resp, r.bytes.data(), sizeof(resp));
    Check(resp.message_len <= kFdChannelMaxMessage, "message too long");
    Check(r.bytes.size() == sizeof(resp) + resp.message_len, "answer length");
    if (r.fd >= 0) {
      Check(resp.code == 0, "fd with an error");
      struct stat st;
      Check(fstat(r.fd, &st) == 0, "fd not open");
      Check(static_cast<uint64_t>(st.st_size) == resp.slab_size, "fd size != slab size");
      const int seals = fcntl(r.fd, F_GET_SEALS);
      Check(seals >= 0 && (seals & F_SEAL_SHRINK) && (seals & F_SEAL_GROW), "slab not sealed");
      Check(ftruncate(r.fd, 0) != 0, "a client shrank a slab");
    }
    if (r.fd2 >= 0) {
      Check(r.fd >= 0 && resp.code == 0, "a second fd without a ring");
      Check(resp.slab_size >= RingLayoutBytes(1) &&
                resp.slab_size <= RingLayoutBytes(kRingMaxSlots) &&
                (resp.slab_size - RingLayoutBytes(0)) % kRingSlotBytes == 0,
            "a ring's memfd of no ring's size");
      char link[64];
      char target[128] = {};
      snprintf(link, sizeof(link), "/proc/self/fd/%d", r.fd2);
      Check(readlink(link, target, sizeof(target) - 1) > 0 &&
                strstr(target, "eventfd") != nullptr,
            "a ring's second fd is not an eventfd");
    }
    ++sends;
    return !((mode & 0x80) && sends % 5 == 0);
  };
  bool open = true;
  for (size_t at = 0; open && at < n; at += chunk) {
    const size_t len = n - at < chunk ? n - at : chunk;
    open = ServeSlabChannel(broker, conn, absl::string_view(bytes + at, len), send,
                            world->rings.get());
    if (open) Check(!WholeRequestWaiting(conn.in), "a whole request left unanswered");
  }
  // The connection closes.
  if (conn.cred.bound_session != 0) {
    const uint64_t bound = conn.cred.bound_session;
    broker->EndConnection(bound);
    Check(!broker->ResolveSessionToken(conn.token, conn.cred).ok(), "token outlived its session");
    StatsView s = broker->Stats(PeerCred{getpid(), 0, 0}, /*include_slabs=*/true);
    for (const DeviceStatsView& d : s.devices) {
      for (const SlabStats& slab : d.slabs) {
        // Only this process's own session may still hold a slab.
        Check(slab.holders <= 1, "an ended session still holds a slab");
      }
    }
  }
  // Only this process's own session may still hold a ring.
  Check(world->rings->ring_count() <= 1, "an ended session still holds a ring");
  return 0;
}
