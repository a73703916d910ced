// StreamTransport: the client's end of gpumem.v1.GpuMemory.Stream, the
// daemon's hot path (one long-lived stream per client instead of one HTTP/2
// stream per call). Each call sends a StreamRequest with a fresh request id
// and waits for the answer carrying that id. Many threads may call at once:
// their requests are pipelined on the one stream, and whichever waiting
// thread is not blocked reads the next answer and hands it to its owner (no
// reader thread, so a lone caller pays one write and one read).
//
// Invariants: answers reach the thread that asked, whatever their order; a
// request's own failure (NOT_FOUND, RESOURCE_EXHAUSTED with its
// PlacementRefusal, ...) comes back exactly as the unary RPC returns it; a
// stream that ends fails the calls waiting on it with UNAVAILABLE saying
// why, and the next call opens a new one (the stream opens on first use).
// A request whose answer was lost may have been carried out; an Allocate is
// freed by the daemon if its answer was never written.
#ifndef GPUMEMD_CLIENT_LIB_CPP_STREAM_TRANSPORT_H_
#define GPUMEMD_CLIENT_LIB_CPP_STREAM_TRANSPORT_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"

namespace gpumem {
namespace client {

class StreamTransport {
 public:
  // `stub` must outlive the transport. A non-empty `session_token` (a
  // process the daemon cannot see by pid: its slab channel's session, see
  // common/fd_channel.h) is sent as metadata when the stream opens.
  explicit StreamTransport(v1::GpuMemory::StubInterface* stub,
                           std::string session_token = "")
      : stub_(stub), session_token_(std::move(session_token)) {}
  // Half-closes the stream and waits for the daemon to end it.
  ~StreamTransport();
  StreamTransport(const StreamTransport&) = delete;
  StreamTransport& operator=(const StreamTransport&) = delete;

  absl::StatusOr<v1::AllocateResponse> Allocate(const v1::AllocateRequest& request);
  absl::StatusOr<v1::FreeResponse> Free(const v1::FreeRequest& request);
  absl::StatusOr<v1::Session> GetSession();
  // Answers a ReclaimRequest push with what was given back.
  absl::Status Reclaimed(uint64_t freed_bytes);

  // Daemon-initiated messages (StreamReply.reclaim) are dropped until this
  // is called. Starts the push reader (once; later calls do nothing): it
  // reads the stream whenever no caller does, so a push reaches an idle
  // program, and gives each push to `handler`, which runs on the reader
  // thread and must return quickly (it must not call this transport: hand
  // the work to another thread).
  using PushHandler = std::function<void(const v1::StreamReply&)>;
  void StartPushReader(PushHandler handler);

  // True once the daemon answered the stream with UNIMPLEMENTED (a daemon
  // without the Stream method; calls fail UNIMPLEMENTED): true for good, and
  // the caller then uses the unary RPCs (Client does).
  bool unsupported() const { return unsupported_.load(std::memory_order_acquire); }

 private:
  struct Open;     // one open stream
  struct Waiter;   // one call waiting for its answer

  // Sends `request` (its id is set here) and returns its answer.
  absl::StatusOr<v1::StreamAnswer> Call(v1::StreamRequest request);
  // Reads one reply from `open` and delivers it; on end of stream fails
  // every call waiting on it. Called by one waiter at a time, without mu_.
  void ReadOne(const std::shared_ptr<Open>& open);
  void PushReaderLoop();

  v1::GpuMemory::StubInterface* const stub_;
  const std::string session_token_;
  std::atomic<bool> unsupported_{false};
  // std::mutex rather than absl::Mutex: ThreadSanitizer sees its edges
  // (Debian's Abseil is not instrumented, and a CondVar wait's re-lock is
  // invisible to common/tsan_support.cc).
  std::mutex mu_;
  std::condition_variable answered_;  // a waiter's `done`, or a reader left
  // Guarded by mu_:
  std::shared_ptr<Open> open_;
  uint64_t next_id_ = 1;
  absl::flat_hash_map<uint64_t, Waiter*> waiting_;
  // The push reader: pushes read by anyone wait here for it (a few at most;
  // more are dropped), and it stops when stop_reader_ is set.
  PushHandler push_handler_;
  std::deque<v1::StreamReply> pushes_;
  bool stop_reader_ = false;
  std::thread reader_;
};

}  // namespace client
}  // namespace gpumem

#endif  // GPUMEMD_CLIENT_LIB_CPP_STREAM_TRANSPORT_H_
