// StreamState: the life of one GpuMemory.Stream call as a small state
// machine: the states it passes through, the events that move it, and one
// table of the allowed moves (kStreamTransitions). What a call may do in a
// state (read a request, write an answer, take a reclaim push, finish) is
// read off its state by the predicates below, never off a mix of flags.
//
// Invariants: a state changes only along a row of the table; kClosed is
// final. An event the table has no row for in the current state is a bug in
// the call: a debug build aborts naming both, a release build keeps the state.
#ifndef GPUMEMD_SERVER_SERVICE_STREAM_STATE_H_
#define GPUMEMD_SERVER_SERVICE_STREAM_STATE_H_

#include <cstddef>
#include <cstdint>
#include <optional>

namespace gpumem {

enum class StreamState : uint8_t {
  kListening,   // posted for the next client; not accepted yet
  kOpen,        // reading requests, writing their answers
  kHalfClosed,  // the client sent its last request; answers still go out
  kFailing,     // a fault ends it: nothing more is read; the answers queued
                // go out, then it finishes with the fault's status
  kBroken,      // the client is gone: nothing more is written or read
  kFinishing,   // Finish started
  kClosed,      // over: Finish completed, or the queue stopped first
};

enum class StreamEvent : uint8_t {
  kAccepted,       // a client opened the stream
  kFault,          // unknown caller, a message that is no request, an id reused
  kReadsEnded,     // a read came back empty: half-close, or the stream broke
  kClientGone,     // cancelled (client gone, deadline), or a write failed
  kFinishStarted,  // nothing more to read or write: Finish was started
  kFinishDone,     // Finish completed
  kQueueStopped,   // the completion queue stops: no new operation, ever
};

struct StreamTransition {
  StreamState from;
  StreamEvent event;
  StreamState to;
};

// Every allowed move; anything else is a bug.
inline constexpr StreamTransition kStreamTransitions[] = {
    {StreamState::kListening, StreamEvent::kAccepted, StreamState::kOpen},
    {StreamState::kOpen, StreamEvent::kFault, StreamState::kFailing},
    {StreamState::kOpen, StreamEvent::kReadsEnded, StreamState::kHalfClosed},
    {StreamState::kOpen, StreamEvent::kClientGone, StreamState::kBroken},
    {StreamState::kOpen, StreamEvent::kQueueStopped, StreamState::kClosed},
    {StreamState::kHalfClosed, StreamEvent::kClientGone, StreamState::kBroken},
    {StreamState::kHalfClosed, StreamEvent::kFinishStarted, StreamState::kFinishing},
    {StreamState::kHalfClosed, StreamEvent::kQueueStopped, StreamState::kClosed},
    {StreamState::kFailing, StreamEvent::kClientGone, StreamState::kBroken},
    {StreamState::kFailing, StreamEvent::kFinishStarted, StreamState::kFinishing},
    {StreamState::kFailing, StreamEvent::kQueueStopped, StreamState::kClosed},
    {StreamState::kBroken, StreamEvent::kReadsEnded, StreamState::kBroken},
    {StreamState::kBroken, StreamEvent::kClientGone, StreamState::kBroken},
    {StreamState::kBroken, StreamEvent::kFinishStarted, StreamState::kFinishing},
    {StreamState::kBroken, StreamEvent::kQueueStopped, StreamState::kClosed},
    {StreamState::kFinishing, StreamEvent::kClientGone, StreamState::kFinishing},
    {StreamState::kFinishing, StreamEvent::kFinishDone, StreamState::kClosed},
    {StreamState::kClosed, StreamEvent::kClientGone, StreamState::kClosed},
};

// The state `event` moves `from` to, or nullopt when the table has no row.
std::optional<StreamState> NextStreamState(StreamState from, StreamEvent event);

const char* StreamStateName(StreamState state);
const char* StreamEventName(StreamEvent event);

// One call's state. Not thread-safe: a call's events all arrive on its
// queue's one thread.
class StreamStateMachine {
 public:
  StreamState state() const { return state_; }

  // Moves along the table (see the file comment for an event it lacks).
  void On(StreamEvent event);

  // New requests are read.
  bool ReadsRequests() const { return state_ == StreamState::kOpen; }
  // Answers are written; an answer that comes back from a worker or from
  // admission joins the outbox (otherwise what it allocated is freed).
  bool WritesAnswers() const {
    return state_ == StreamState::kOpen || state_ == StreamState::kHalfClosed ||
           state_ == StreamState::kFailing;
  }
  // A reclaim push is written (only to a client that can still answer it).
  bool TakesPushes() const { return state_ == StreamState::kOpen; }
  // Finish was started, or the call is over.
  bool Ending() const {
    return state_ == StreamState::kFinishing || state_ == StreamState::kClosed;
  }
  bool Closed() const { return state_ == StreamState::kClosed; }

 private:
  StreamState state_ = StreamState::kListening;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_STREAM_STATE_H_
