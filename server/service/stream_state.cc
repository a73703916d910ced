// See stream_state.h. The table is a handful of rows and is looked up only
// when a stream's life moves on (a few times per stream, never per request),
// so a linear search is all it needs.
#include "server/service/stream_state.h"

#include <cstdio>
#include <cstdlib>

namespace gpumem {

std::optional<StreamState> NextStreamState(StreamState from, StreamEvent event) {
  for (const StreamTransition& t : kStreamTransitions) {
    if (t.from == from && t.event == event) return t.to;
  }
  return std::nullopt;
}

const char* StreamStateName(StreamState state) {
  switch (state) {
    case StreamState::kListening: return "listening";
    case StreamState::kOpen: return "open";
    case StreamState::kHalfClosed: return "half-closed";
    case StreamState::kFailing: return "failing";
    case StreamState::kBroken: return "broken";
    case StreamState::kFinishing: return "finishing";
    case StreamState::kClosed: return "closed";
  }
  return "?";
}

const char* StreamEventName(StreamEvent event) {
  switch (event) {
    case StreamEvent::kAccepted: return "accepted";
    case StreamEvent::kFault: return "fault";
    case StreamEvent::kReadsEnded: return "reads-ended";
    case StreamEvent::kClientGone: return "client-gone";
    case StreamEvent::kFinishStarted: return "finish-started";
    case StreamEvent::kFinishDone: return "finish-done";
    case StreamEvent::kQueueStopped: return "queue-stopped";
  }
  return "?";
}

void StreamStateMachine::On(StreamEvent event) {
  std::optional<StreamState> next = NextStreamState(state_, event);
  if (!next.has_value()) {
#ifndef NDEBUG
    fprintf(stderr, "stream call: no transition for event %s in state %s\n",
            StreamEventName(event), StreamStateName(state_));
    abort();
#endif
    return;
  }
  state_ = *next;
}

}  // namespace gpumem
