// CqEvent: what a tag on the daemon's completion queues points to.
//
// The async parts of the daemon (the Stream RPC, the health Watch) share the
// completion queues StreamService drains: every thread blocked on a server
// completion queue also polls every connection, so each extra queue thread
// costs every call wake-ups (README, "Hot path"). A queue's thread calls
// OnEvent(ok) of each tag it dequeues; the object behind the tag decides
// what the event means and may delete its owner.
#ifndef GPUMEMD_SERVER_SERVICE_CQ_EVENT_H_
#define GPUMEMD_SERVER_SERVICE_CQ_EVENT_H_

namespace gpumem {

class CqEvent {
 public:
  virtual void OnEvent(bool ok) = 0;

 protected:
  ~CqEvent() = default;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_CQ_EVENT_H_
