// The Stream call's state machine (server/service/stream_state.h): the lives
// a stream can lead, what each state allows, that kClosed is final, and that
// an event the table does not allow is caught in a debug build (and leaves
// the state as it was in a release build).
#include "server/service/stream_state.h"

#include <set>
#include <utility>

#include "gtest/gtest.h"

namespace gpumem {
namespace {

constexpr StreamState kAllStates[] = {
    StreamState::kListening, StreamState::kOpen,      StreamState::kHalfClosed,
    StreamState::kFailing,   StreamState::kBroken,    StreamState::kFinishing,
    StreamState::kClosed,
};
constexpr StreamEvent kAllEvents[] = {
    StreamEvent::kAccepted,      StreamEvent::kFault,      StreamEvent::kReadsEnded,
    StreamEvent::kClientGone,    StreamEvent::kFinishStarted, StreamEvent::kFinishDone,
    StreamEvent::kQueueStopped,
};

StreamStateMachine Through(std::initializer_list<StreamEvent> events) {
  StreamStateMachine m;
  for (StreamEvent e : events) m.On(e);
  return m;
}

TEST(StreamStateTest, AClientThatHalfClosesIsAnsweredThenFinished) {
  StreamStateMachine m;
  EXPECT_EQ(m.state(), StreamState::kListening);
  EXPECT_FALSE(m.ReadsRequests());
  m.On(StreamEvent::kAccepted);
  EXPECT_EQ(m.state(), StreamState::kOpen);
  EXPECT_TRUE(m.ReadsRequests());
  EXPECT_TRUE(m.WritesAnswers());
  EXPECT_TRUE(m.TakesPushes());
  m.On(StreamEvent::kReadsEnded);
  EXPECT_EQ(m.state(), StreamState::kHalfClosed);
  EXPECT_FALSE(m.ReadsRequests());
  EXPECT_TRUE(m.WritesAnswers()) << "the answers owed still go out";
  EXPECT_FALSE(m.TakesPushes()) << "a client that sends nothing more cannot answer a reclaim";
  m.On(StreamEvent::kFinishStarted);
  EXPECT_EQ(m.state(), StreamState::kFinishing);
  EXPECT_TRUE(m.Ending());
  EXPECT_FALSE(m.WritesAnswers());
  m.On(StreamEvent::kFinishDone);
  EXPECT_TRUE(m.Closed());
}

TEST(StreamStateTest, AFaultStopsReadingButWritesWhatIsQueued) {
  StreamStateMachine m = Through({StreamEvent::kAccepted, StreamEvent::kFault});
  EXPECT_EQ(m.state(), StreamState::kFailing);
  EXPECT_FALSE(m.ReadsRequests());
  EXPECT_TRUE(m.WritesAnswers());
  EXPECT_FALSE(m.TakesPushes());
  m.On(StreamEvent::kFinishStarted);
  m.On(StreamEvent::kFinishDone);
  EXPECT_TRUE(m.Closed());
}

TEST(StreamStateTest, AGoneClientGetsNothingMoreFromAnyLiveState) {
  for (StreamState from : {StreamState::kOpen, StreamState::kHalfClosed, StreamState::kFailing,
                           StreamState::kBroken}) {
    EXPECT_EQ(NextStreamState(from, StreamEvent::kClientGone), StreamState::kBroken)
        << StreamStateName(from);
  }
  StreamStateMachine m = Through({StreamEvent::kAccepted, StreamEvent::kClientGone});
  EXPECT_FALSE(m.ReadsRequests());
  EXPECT_FALSE(m.WritesAnswers()) << "answers made later are freed, not written";
  EXPECT_FALSE(m.TakesPushes());
  // A read that was outstanding comes back after the cancel: still broken.
  m.On(StreamEvent::kReadsEnded);
  EXPECT_EQ(m.state(), StreamState::kBroken);
  m.On(StreamEvent::kFinishStarted);
  // The done event may say "cancelled" while Finish is under way.
  m.On(StreamEvent::kClientGone);
  EXPECT_EQ(m.state(), StreamState::kFinishing);
  m.On(StreamEvent::kFinishDone);
  EXPECT_TRUE(m.Closed());
}

TEST(StreamStateTest, AStoppingQueueClosesEveryLiveStateWithoutFinish) {
  for (StreamState from : {StreamState::kOpen, StreamState::kHalfClosed, StreamState::kFailing,
                           StreamState::kBroken}) {
    EXPECT_EQ(NextStreamState(from, StreamEvent::kQueueStopped), StreamState::kClosed)
        << StreamStateName(from);
  }
  // Finish under way completes on its own (its event comes as the queue
  // drains).
  EXPECT_EQ(NextStreamState(StreamState::kFinishing, StreamEvent::kQueueStopped), std::nullopt);
}

TEST(StreamStateTest, ClosedIsFinal) {
  for (StreamEvent e : kAllEvents) {
    std::optional<StreamState> next = NextStreamState(StreamState::kClosed, e);
    if (next.has_value()) {
      EXPECT_EQ(*next, StreamState::kClosed) << StreamEventName(e);
    }
  }
}

TEST(StreamStateTest, TheTableHasOneRowPerStateAndEvent) {
  std::set<std::pair<StreamState, StreamEvent>> seen;
  for (const StreamTransition& t : kStreamTransitions) {
    EXPECT_TRUE(seen.emplace(t.from, t.event).second)
        << StreamStateName(t.from) << " + " << StreamEventName(t.event) << " twice";
  }
  // Every state but the first is reached by some row; every event moves
  // some state.
  for (StreamState s : kAllStates) {
    if (s == StreamState::kListening) continue;
    bool reached = false;
    for (const StreamTransition& t : kStreamTransitions) reached |= t.to == s && t.from != s;
    EXPECT_TRUE(reached) << StreamStateName(s);
  }
  for (StreamEvent e : kAllEvents) {
    bool used = false;
    for (const StreamTransition& t : kStreamTransitions) used |= t.event == e;
    EXPECT_TRUE(used) << StreamEventName(e);
  }
}

TEST(StreamStateTest, TheNamesAreDistinct) {
  std::set<std::string> states, events;
  for (StreamState s : kAllStates) EXPECT_TRUE(states.insert(StreamStateName(s)).second);
  for (StreamEvent e : kAllEvents) EXPECT_TRUE(events.insert(StreamEventName(e)).second);
}

// A bug in the call (reading after the stream was accepted twice, finishing
// a stream still open) is caught in debug builds, naming the event and the
// state; a release build keeps the state.
TEST(StreamStateTest, AnEventTheTableDoesNotAllowIsCaughtInDebugBuilds) {
  StreamStateMachine m = Through({StreamEvent::kAccepted});
  EXPECT_DEBUG_DEATH(m.On(StreamEvent::kAccepted),
                     "no transition for event accepted in state open");
  EXPECT_EQ(m.state(), StreamState::kOpen);
  EXPECT_DEBUG_DEATH(m.On(StreamEvent::kFinishStarted),
                     "no transition for event finish-started in state open");
  EXPECT_EQ(m.state(), StreamState::kOpen);
  StreamStateMachine closed = Through({StreamEvent::kAccepted, StreamEvent::kQueueStopped});
  EXPECT_DEBUG_DEATH(closed.On(StreamEvent::kAccepted),
                     "no transition for event accepted in state closed");
  EXPECT_TRUE(closed.Closed());
}

}  // namespace
}  // namespace gpumem
