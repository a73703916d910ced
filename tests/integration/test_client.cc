// test_client: a real client process for the multi-process tests.
//
// Modes (one per run):
//   --size=BYTES --count=N [--devices=0,1] --then=hold|exit|free|free_hold
//       allocates N mapped buffers (round-robin over --devices), fills each
//       with the byte (id & 0xff), prints "alloc ID DEVICE SLAB OFFSET SIZE"
//       per buffer and "ready", then holds them until killed, exits without
//       freeing (_exit), or frees them and prints "freed" (free_hold: then
//       lives on, holding nothing, until killed).
//   --read_slab=ID --offset=O --expect=B
//       fetches a slab's fd over the slab channel, maps it and prints
//       "read ok" if the byte at O is B, else "read mismatch", or
//       "error CODE" if the daemon refused.
//   --free=ID   prints "status CODE" of Free(ID).
//   --keep --size=BYTES [--devices=D]
//       allocates one block with the raw RPC, maps its slab itself, fills
//       the block with 0xAA, frees it but keeps the mapping (as a hostile
//       or careless process may), prints "kept SLAB SLAB_SIZE"; then on each
//       SIGUSR1 scans the whole mapping and prints "clean" if every byte is
//       0xAA (its old block) or 0 (never written), else "foreign".
//   --session_race=N
//       N threads call GetSession at once; prints "sessions K" (distinct ids).
//   --stats     prints "sessions N uids U1,U2,... tenants T1,T2,..." as
//               GetStats shows them to this process.
//   --tenant_rpc=put|delete|set_quota|usage [--tenant=NAME]
//       one tenant RPC over a plain gRPC channel (no session token): prints
//       "status CODE" (put, delete, set_quota) or "usage T1,T2,..." (the
//       tenant names GetUsage shows this caller), or "status CODE" if refused.
//   --session   prints "session ID PID UID" as GetSession answers.
//   --clients=N --size=BYTES
//       N separate clients (each its own gRPC connection, stream and slab
//       channel), each allocating and mapping one buffer; prints "ready"
//       (or "error CODE CLIENT") and holds them until killed.
// Every line is flushed at once so the parent can follow along.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <set>
#include <thread>
#include <cstring>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/strings/str_split.h"
#include "client/lib/cpp/client.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"
#include "common/fd_channel.h"

ABSL_FLAG(std::string, socket, "", "daemon socket");
ABSL_FLAG(uint64_t, size, 0, "bytes per buffer");
ABSL_FLAG(int, count, 1, "buffers");
ABSL_FLAG(std::string, devices, "", "comma-separated selectors, round-robin");
ABSL_FLAG(std::string, then, "hold", "hold | exit | free | free_hold | check");
ABSL_FLAG(std::string, check_file, "",
          "--then=check: once this file exists, check every buffer's bytes, then free them");
ABSL_FLAG(uint64_t, read_slab, 0, "slab to map and read");
ABSL_FLAG(uint64_t, offset, 0, "offset to read");
ABSL_FLAG(int, expect, 0, "expected byte");
ABSL_FLAG(uint64_t, free, 0, "allocation to free");
ABSL_FLAG(bool, keep, false, "free a block but keep its slab mapped");
ABSL_FLAG(int, session_race, 0, "threads calling GetSession at once");
ABSL_FLAG(bool, stats, false, "print what GetStats shows this caller");
ABSL_FLAG(int, clients, 0, "separate clients, one mapped buffer each");
ABSL_FLAG(std::string, tenant_rpc, "", "put | delete | set_quota | usage");
ABSL_FLAG(std::string, tenant, "probe", "the tenant --tenant_rpc names");
ABSL_FLAG(bool, session, false, "print what GetSession answers");

namespace gpumem {
using client::Client;
using client::Buffer;
namespace {

volatile sig_atomic_t check_requested = 0;

int Keep(Client& client, const std::string& socket) {
  v1::AllocateRequest req;
  req.set_size_bytes(absl::GetFlag(FLAGS_size));
  if (!absl::GetFlag(FLAGS_devices).empty()) {
    req.mutable_placement()->add_devices(absl::GetFlag(FLAGS_devices));
  }
  absl::StatusOr<v1::AllocateResponse> r = client.AllocateRaw(req);
  if (!r.ok()) {
    printf("error %d\n", static_cast<int>(r.status().code()));
    return 1;
  }
  const v1::Allocation& a = r->allocations(0);
  absl::StatusOr<int> ch = ConnectFdChannel(socket);
  if (!ch.ok()) return 1;
  absl::StatusOr<SlabFd> slab = RequestSlabFd(*ch, a.slab_id());
  if (!slab.ok()) {
    printf("error %d\n", static_cast<int>(slab.status().code()));
    return 1;
  }
  auto* base = static_cast<unsigned char*>(
      mmap(nullptr, slab->size, PROT_READ | PROT_WRITE, MAP_SHARED, slab->fd, 0));
  if (base == MAP_FAILED) return 1;
  memset(base + a.offset(), 0xAA, a.size_bytes());
  if (!client.Free(a.id()).ok()) return 1;
  signal(SIGUSR1, [](int) { check_requested = 1; });
  printf("kept %lu %lu\n", static_cast<unsigned long>(a.slab_id()),
         static_cast<unsigned long>(slab->size));
  fflush(stdout);
  for (;;) {
    pause();
    if (!check_requested) continue;
    check_requested = 0;
    bool clean = true;
    for (uint64_t i = 0; i < slab->size; ++i) {
      if (base[i] != 0 && base[i] != 0xAA) {
        clean = false;
        break;
      }
    }
    printf(clean ? "clean\n" : "foreign\n");
    fflush(stdout);
  }
}

int SessionRace(Client& client, int n) {
  std::vector<std::thread> threads;
  absl::Notification go;  // all threads exist before any calls
  std::vector<uint64_t> ids(n, 0);
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      go.WaitForNotification();
      absl::StatusOr<v1::Session> s = client.GetSession();
      ids[i] = s.ok() ? s->session_id() : 0;
    });
  }
  go.Notify();
  for (std::thread& t : threads) t.join();
  std::set<uint64_t> distinct(ids.begin(), ids.end());
  printf("sessions %zu%s\n", distinct.size(), distinct.count(0) ? " with errors" : "");
  return 0;
}

int Stats(Client& client) {
  if (!client.GetSession().ok()) return 1;  // so it has a session to see
  absl::StatusOr<v1::GetStatsResponse> s = client.GetStats(/*include_slabs=*/true);
  if (!s.ok()) {
    printf("error %d\n", static_cast<int>(s.status().code()));
    return 1;
  }
  std::set<uint32_t> uids, tenants;
  for (const v1::SessionStats& ss : s->sessions()) uids.insert(ss.uid());
  for (const v1::TenantStats& t : s->tenants()) tenants.insert(t.tenant());
  printf("sessions %d uids %s tenants %s devices %d\n", s->sessions_size(),
         absl::StrJoin(uids, ",").c_str(), absl::StrJoin(tenants, ",").c_str(),
         s->devices_size());
  return 0;
}

int TenantRpc(const std::string& socket, const std::string& rpc) {
  auto stub = v1::GpuMemory::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Status s;
  const std::string tenant = absl::GetFlag(FLAGS_tenant);
  if (rpc == "put") {
    v1::PutTenantRequest req;
    req.set_name(tenant);
    v1::PutTenantResponse resp;
    s = stub->PutTenant(&ctx, req, &resp);
  } else if (rpc == "delete") {
    v1::DeleteTenantRequest req;
    req.set_name(tenant);
    req.set_end_sessions(true);
    v1::DeleteTenantResponse resp;
    s = stub->DeleteTenant(&ctx, req, &resp);
  } else if (rpc == "set_quota") {
    v1::SetQuotaRequest req;
    req.set_tenant(tenant);
    req.mutable_quota()->set_total_bytes(uint64_t{1} << 40);
    v1::SetQuotaResponse resp;
    s = stub->SetQuota(&ctx, req, &resp);
  } else if (rpc == "usage") {
    v1::GetUsageResponse resp;
    s = stub->GetUsage(&ctx, v1::GetUsageRequest(), &resp);
    if (s.ok()) {
      std::vector<std::string> names;
      for (const v1::TenantUsage& t : resp.tenants()) names.push_back(t.name());
      printf("usage %s\n", absl::StrJoin(names, ",").c_str());
      return 0;
    }
  } else {
    printf("error unknown --tenant_rpc\n");
    return 1;
  }
  printf("status %d\n", static_cast<int>(s.error_code()));
  return 0;
}

int ManyClients(const std::string& socket, int n) {
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<Buffer> buffers;
  for (int i = 0; i < n; ++i) {
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(socket);
    absl::StatusOr<Buffer> b =
        c.ok() ? (*c)->Allocate(absl::GetFlag(FLAGS_size)) : c.status();
    if (!b.ok()) {
      printf("error %d %d %s\n", static_cast<int>(b.status().code()), i,
             std::string(b.status().message()).c_str());
      fflush(stdout);
      return 1;
    }
    memset(b->data(), 0x5A, b->size());
    buffers.push_back(std::move(*b));
    clients.push_back(std::move(*c));
  }
  printf("ready\n");
  fflush(stdout);
  for (;;) pause();
}

int Main() {
  const std::string socket = absl::GetFlag(FLAGS_socket);
  if (absl::GetFlag(FLAGS_clients) > 0) {
    return ManyClients(socket, absl::GetFlag(FLAGS_clients));
  }
  if (absl::GetFlag(FLAGS_read_slab) != 0) {
    absl::StatusOr<int> ch = ConnectFdChannel(socket);
    if (!ch.ok()) {
      printf("error %d\n", static_cast<int>(ch.status().code()));
      return 1;
    }
    absl::StatusOr<SlabFd> slab = RequestSlabFd(*ch, absl::GetFlag(FLAGS_read_slab));
    if (!slab.ok()) {
      printf("error %d\n", static_cast<int>(slab.status().code()));
      return 0;
    }
    void* base = mmap(nullptr, slab->size, PROT_READ, MAP_SHARED, slab->fd, 0);
    if (base == MAP_FAILED) {
      printf("error mmap\n");
      return 1;
    }
    unsigned char b = static_cast<unsigned char*>(base)[absl::GetFlag(FLAGS_offset)];
    printf(b == absl::GetFlag(FLAGS_expect) ? "read ok\n" : "read mismatch\n");
    return 0;
  }
  if (!absl::GetFlag(FLAGS_tenant_rpc).empty()) {
    return TenantRpc(socket, absl::GetFlag(FLAGS_tenant_rpc));
  }
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(socket);
  if (!client.ok()) {
    printf("error %d\n", static_cast<int>(client.status().code()));
    return 1;
  }
  if (absl::GetFlag(FLAGS_session)) {
    absl::StatusOr<v1::Session> s = (*client)->GetSession();
    if (!s.ok()) {
      printf("error %d\n", static_cast<int>(s.status().code()));
      return 1;
    }
    printf("session %lu %d %u\n", static_cast<unsigned long>(s->session_id()), s->pid(), s->uid());
    return 0;
  }
  if (absl::GetFlag(FLAGS_keep)) return Keep(**client, socket);
  if (absl::GetFlag(FLAGS_session_race) > 0) {
    return SessionRace(**client, absl::GetFlag(FLAGS_session_race));
  }
  if (absl::GetFlag(FLAGS_stats)) return Stats(**client);
  if (absl::GetFlag(FLAGS_free) != 0) {
    absl::Status s = (*client)->Free(absl::GetFlag(FLAGS_free));
    printf("status %d\n", static_cast<int>(s.code()));
    fflush(stdout);
    return 0;
  }
  std::vector<std::string> devices;
  if (!absl::GetFlag(FLAGS_devices).empty()) {
    devices = absl::StrSplit(absl::GetFlag(FLAGS_devices), ',');
  }
  std::vector<Buffer> buffers;
  for (int i = 0; i < absl::GetFlag(FLAGS_count); ++i) {
    v1::PlacementRequest placement;
    if (!devices.empty()) placement.add_devices(devices[i % devices.size()]);
    absl::StatusOr<Buffer> b = (*client)->Allocate(absl::GetFlag(FLAGS_size), placement);
    if (!b.ok()) {
      printf("error %d %s\n", static_cast<int>(b.status().code()),
             std::string(b.status().message()).c_str());
      fflush(stdout);
      return 1;
    }
    memset(b->data(), static_cast<int>(b->id() & 0xff), b->size());
    printf("alloc %lu %u %lu %lu %lu\n", static_cast<unsigned long>(b->id()),
           b->device_index(), static_cast<unsigned long>(b->allocation().slab_id()),
           static_cast<unsigned long>(b->allocation().offset()),
           static_cast<unsigned long>(b->size()));
    buffers.push_back(std::move(*b));
  }
  printf("ready\n");
  fflush(stdout);
  const std::string then = absl::GetFlag(FLAGS_then);
  if (then == "exit") _exit(0);  // no destructors: the daemon must reclaim
  if (then == "free" || then == "free_hold") {
    for (Buffer& b : buffers) {
      if (!b.Free().ok()) return 1;
    }
    buffers.clear();
    printf("freed\n");
    fflush(stdout);
    if (then == "free") return 0;
    for (;;) pause();  // the session lives on; its slabs were closed
  }
  if (then == "check") {
    // (A daemon restart may come meanwhile: the library carries the
    // buffers over.)
    while (access(absl::GetFlag(FLAGS_check_file).c_str(), F_OK) != 0) usleep(20 * 1000);
    int intact = 0, lost = 0;
    for (Buffer& b : buffers) {
      if ((*client)->IsLost(b.id())) ++lost;
      const unsigned char want = static_cast<unsigned char>(b.id() & 0xff);
      const unsigned char* p = static_cast<const unsigned char*>(b.data());
      bool same = true;
      for (uint64_t i = 0; i < b.size() && same; ++i) same = p[i] == want;
      if (same) ++intact;
    }
    for (Buffer& b : buffers) {
      absl::Status s = b.Free();
      if (!s.ok()) {
        printf("free error %d %s\n", static_cast<int>(s.code()), std::string(s.message()).c_str());
        fflush(stdout);
        return 1;
      }
    }
    // (The frees waited for the library to come through a restart.)
    printf("intact %d lost %d restarts %d\n", intact, lost, static_cast<int>((*client)->restarts()));
    printf("freed\n");
    fflush(stdout);
    return 0;
  }
  for (;;) pause();
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gpumem::Main();
}
