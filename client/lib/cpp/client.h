// gpumem::Client: the thin C++ client of gpumemd.
//
// Connect() opens one gRPC channel and one slab-handle channel to the
// daemon's socket. Allocate, Free and GetSession travel on one long-lived
// stream (stream_transport.h), or as unary RPCs against a daemon without it.
// Allocate() returns a Buffer whose data() the process can use at once: the
// first block in a slab makes the client open the slab the way its handle
// kind says (client/lib/slabs/slab_mapper.h); later blocks in the same slab reuse it
// (slabs are refcounted and closed when the last Buffer in them goes away).
//
// Invariants: a Buffer frees its block when destroyed (RAII), and if the
// process dies instead the daemon frees everything it held as soon as it
// exits; a daemon restart changes nothing for the program (Client::
// OnRestart says what it does). Thread-safe: one Client may be used from
// many threads.
#ifndef GPUMEMD_CLIENT_LIB_CPP_CLIENT_H_
#define GPUMEMD_CLIENT_LIB_CPP_CLIENT_H_

#include <cstdint>
#include <memory>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/gpumem/v1/gpumem.pb.h"

namespace gpumem {
namespace client {

class Client;

// A block of device memory, mapped into this process. Movable, not copyable.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();  // frees the block (errors are ignored: the daemon reclaims it)

  // With the sim backend host memory shared with the daemon and any other
  // importer; with the cuda backend a device pointer on the allocation's
  // device (found by UUID, so CUDA_VISIBLE_DEVICES may renumber).
  void* data() const { return data_; }
  uint64_t size() const { return info_.size_bytes(); }
  uint32_t device_index() const { return info_.device_index(); }
  const std::string& device_uuid() const { return info_.device_uuid(); }
  uint64_t id() const { return info_.id(); }
  const v1::Allocation& allocation() const { return info_; }
  bool valid() const { return client_ != nullptr; }

  // Copies host memory into [offset, offset + n) of the buffer, or out of
  // it: memcpy on sim, cuMemcpyHtoD/DtoH on cuda. OUT_OF_RANGE past size().
  absl::Status Write(uint64_t offset, const void* src, uint64_t n) const;
  absl::Status Read(uint64_t offset, void* dst, uint64_t n) const;

  // Frees the block; the Buffer becomes empty. Host memory (sim) and a block
  // lost at a restart: now, with the daemon's answer. Device memory (cuda):
  // returns at once, and the block is unmapped and given back only once all
  // the work this process queued on its device before the call has completed
  // (as cudaFree's implicit synchronization would ensure, without waiting in
  // the call): a thread of the Client synchronizes the device and then
  // frees (Client::FlushFrees waits for that). The destructor does the same.
  absl::Status Free();
  // Frees now and reports the daemon's answer, without waiting for device
  // work: for a caller that knows no queued work uses the block any more
  // (it synchronized, or its own fences passed: the caching pool's leases).
  absl::Status FreeNow();

  // Forgets the block without telling the daemon; the Buffer becomes
  // empty. For a daemon that has gone away: a restarted daemon may have
  // given this id to another block, so freeing it there would be wrong. When
  // the last Buffer of its slab is abandoned the slab's memory is given back
  // but its addresses stay reserved for the Client's life
  // (OpenedSlab::Retire), so no later allocation lands on them.
  void Abandon();

 private:
  friend class Client;
  Buffer(Client* client, v1::Allocation info, void* data)
      : client_(client), info_(std::move(info)), data_(data) {}
  void Reset();

  Client* client_ = nullptr;
  v1::Allocation info_;
  void* data_ = nullptr;
};

class Client {
 public:
  // The socket: `socket_path`, else $GPUMEMD_SOCKET, else
  // /run/gpumemd/gpumemd.sock. Fails with UNAVAILABLE at once when nothing
  // listens there; a daemon that takes the connection and hangs up before
  // answering (it died or is restarting) is tried again until
  // GPUMEM_RECONNECT_MS has passed, as calls are (a try the daemon stays
  // silent on lasts 5 s). A refusal is returned as it came.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(std::string socket_path = "");
  ~Client();

  // `size` bytes placed by `placement` (default: any device, least loaded).
  // Both calls send the CUDA devices this process can see (unless
  // `placement.visible_devices` is set): the daemon places only on those and
  // refuses, by name, a placement naming another (FAILED_PRECONDITION).
  absl::StatusOr<Buffer> Allocate(uint64_t size,
                                  const v1::PlacementRequest& placement = {},
                                  uint64_t alignment = 0);
  // One Buffer per shard, each on a distinct device; all or nothing.
  absl::StatusOr<std::vector<Buffer>> AllocateSharded(
      uint64_t total_size, uint32_t shards,
      const v1::PlacementRequest& placement = {});

  // The raw RPCs, for tools that do not map memory (gpumemctl). AllocateRaw
  // gives a request without a request_key a new one (kept across its
  // retries over a daemon restart); a key the caller set is sent as it is.
  absl::StatusOr<v1::AllocateResponse> AllocateRaw(const v1::AllocateRequest& request);
  // The raw Free RPC: the daemon takes the block back now (no wait for
  // device work; Buffer::Free has that).
  absl::Status Free(uint64_t allocation_id);
  // Waits until every Buffer freed before the call has been given back to
  // the daemon (their devices' queued work has run). Allocate and
  // AllocateSharded do it themselves before answering RESOURCE_EXHAUSTED.
  void FlushFrees();
  absl::StatusOr<v1::GetStatsResponse> GetStats(bool include_slabs = false);
  absl::StatusOr<v1::Session> GetSession();
  absl::StatusOr<v1::GetUsageResponse> GetUsage();
  absl::StatusOr<v1::GetLedgerResponse> GetLedger(const v1::GetLedgerRequest& request);
  absl::StatusOr<v1::SetQuotaResponse> SetQuota(const v1::SetQuotaRequest& request);

  const std::string& socket_path() const;

  // The handle kind later Allocate calls ask for (default UNSPECIFIED: the
  // daemon's default). E.g. HANDLE_KIND_CUDA_IPC for code that needs
  // cudaIpcMemHandle_t; the daemon answers FAILED_PRECONDITION if it does not
  // offer the kind.
  void SetHandleKind(v1::HandleKind kind);

  // Usage figures (proto UsageReport) sent with every later Allocate and
  // Free this Client makes (not AllocateRaw's, which are sent as given), so
  // the daemon's GetStats shows them for this session. The caching pool
  // sets them before each lease it takes or gives back.
  void SetUsageReport(const v1::UsageReport& usage);

  // Memory pressure: from now on a library thread reads this client's
  // stream whenever no call does, and `on_reclaim` is called on it each
  // time the daemon asks for idle memory back (StreamReply.reclaim). It must
  // return quickly and must not call this Client (hand the work to another
  // thread, which answers with ReportReclaimed after its Frees).
  void OnReclaimRequest(std::function<void(const v1::ReclaimRequest&)> on_reclaim);
  absl::Status ReportReclaimed(uint64_t freed_bytes);

  // The library's own state (client/lib/cpp/client_impl.h).
  struct Impl;

  // A daemon restart (crash, kill -9, upgrade) changes nothing for the
  // program: the client notices at once (its slab channel hangs up), and a
  // library thread reconnects in the background, re-presents this process's
  // session and every live block (Resume), and hands back the handles of
  // slabs the new daemon lacks. Blocks that survived keep their ids and
  // pointers and are freed normally; calls made meanwhile wait (at most
  // GPUMEM_RECONNECT_MS, default 30000) and then go to the new daemon. A
  // block that did not survive stays mapped until its Buffer goes; its Free
  // answers the daemon's reason (NOT_FOUND). A daemon that stops for good
  // (SIGTERM: it releases everything) says so before it goes: then every
  // block is lost at once and calls fail UNAVAILABLE without waiting, until
  // a daemon is back.
  // After each daemon restart this client came through, on the library's
  // thread: which of its blocks survived and which were lost, each lost one
  // with the daemon's reason. Must return quickly and must not wait for
  // this Client's calls (they may be waiting for this restart to finish).
  struct RestartReport {
    std::vector<uint64_t> kept;
    std::vector<std::pair<uint64_t, absl::Status>> lost;
    absl::Duration took;  // from the hangup to serving again
  };
  void OnRestart(std::function<void(const RestartReport&)> on_restart);
  // Daemon restarts this client came through so far.
  uint64_t restarts() const;
  // The block `allocation_id` was lost at a restart (its Free answers why).
  bool IsLost(uint64_t allocation_id) const;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  absl::StatusOr<void*> MapBlock(const v1::Allocation& a);
  // One Buffer fewer in the block's slab; the last closes it (`retire`:
  // retires it, see Buffer::Abandon).
  void UnmapBlock(const v1::Allocation& a, bool retire);
  // Buffer::Free: now, or after its device's queued work (deferred_frees.h).
  absl::Status FreeBlock(v1::Allocation a);
  // AllocateRaw, once more after the deferred frees when it was refused for
  // room while some were waiting.
  absl::StatusOr<v1::AllocateResponse> AllocateRawAfterFrees(const v1::AllocateRequest& request);
  absl::Status CopyBlock(const v1::Allocation& a, uint64_t offset, const void* src,
                         void* dst, uint64_t n);
  friend class Buffer;

  // Runs `call` on the current link; when it fails because the daemon went
  // away, waits for the reconnect and runs it once more on the new link.
  template <typename T, typename Fn>
  absl::StatusOr<T> WithRestart(Fn call);
  absl::Status FreeOnce(uint64_t allocation_id, bool* daemon_gone);
  // The restart thread (client_restart.cc).
  void WatchLoop();
  void Reconnect();
  // The daemon said it stopped for good: every block is lost now.
  void DaemonStopped();

  std::unique_ptr<Impl> impl_;
};

// When placement refused an Allocate (RESOURCE_EXHAUSTED), why, per device:
// capacity, fragmentation, quota, excluded. nullopt for any other status.
std::optional<v1::PlacementRefusal> PlacementRefusalOf(const absl::Status& status);

// The socket a client uses when none is given (see Client::Connect).
std::string DefaultSocketPath();

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_CPP_CLIENT_H_
