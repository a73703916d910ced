// See slab_channel.h. The request loop and the answer of one request; the
// listener does the reading (and receives the fds of kGiveSlab).
#include "server/service/slab_channel.h"

#include <unistd.h>

#include <cstring>

#include "common/fd_channel.h"

namespace gpumem {
namespace {

// Answers one request; false when the connection must be closed.
bool Answer(MemoryBroker* broker, SlabChannelConn& conn, const SlabRequest& req,
            absl::string_view payload,
            const std::function<bool(const SlabChannelReply&)>& send, RingLender* rings) {
  if (memcmp(req.magic, kFdChannelMagic, 4) != 0 || req.version != kFdChannelVersion) {
    return false;  // not our protocol (or another version of it)
  }
  SlabResponse resp = {};
  absl::Status status;
  SlabChannelReply reply;
  switch (static_cast<SlabOp>(req.op)) {
    case SlabOp::kOpenSlab: {
      absl::StatusOr<SlabFd> slab = broker->ExportSlab(conn.cred, req.slab_id);
      if (slab.ok()) {
        resp.slab_size = slab->size;
        reply.fd = slab->fd;
      }
      status = slab.status();
      break;
    }
    case SlabOp::kCloseSlab:
      status = broker->CloseSlab(conn.cred, req.slab_id);
      break;
    case SlabOp::kHello:
      if (conn.cred.pid <= 0 && conn.cred.bound_session == 0) {
        absl::StatusOr<std::shared_ptr<Session>> s = broker->BindConnection(conn.cred);
        status = s.status();
        if (s.ok()) {
          conn.cred.bound_session = (*s)->id();
          conn.token = (*s)->token();
        }
      }
      break;
    case SlabOp::kRebind:
      if (conn.cred.bound_session != 0) {
        status = absl::FailedPreconditionError(
            "this channel has a session already: rebind on a new channel, before hello");
      } else {
        absl::StatusOr<std::shared_ptr<Session>> s =
            broker->RebindConnection(conn.cred, std::string(payload));
        status = s.status();
        if (s.ok()) {
          conn.cred.bound_session = (*s)->id();
          conn.token = (*s)->token();
        }
      }
      break;
    case SlabOp::kGiveSlab:
      if (conn.fds.empty()) {
        status = absl::InvalidArgumentError("GIVE_SLAB came without an fd attached");
      } else {
        const int given = conn.fds.front();
        conn.fds.pop_front();
        status = broker->AcceptSlabHandle(conn.cred, req.slab_id, given);  // takes it
      }
      break;
    case SlabOp::kOpenRing: {
      absl::StatusOr<LentRing> ring =
          rings == nullptr ? absl::StatusOr<LentRing>(RingsOffError())
                           : rings->Lend(conn.cred, req.slab_id);
      if (ring.ok()) {
        resp.slab_size = ring->size;
        reply.fd = ring->memfd;
        reply.fd2 = ring->eventfd;
      }
      status = ring.status();
      break;
    }
    default:
      return false;
  }
  const bool answers_token = static_cast<SlabOp>(req.op) == SlabOp::kHello ||
                             static_cast<SlabOp>(req.op) == SlabOp::kRebind;
  if (status.ok() && answers_token) {
    resp.message_len = static_cast<uint32_t>(conn.token.size());
    reply.bytes.assign(reinterpret_cast<const char*>(&resp), sizeof(resp));
    reply.bytes += conn.token;
  } else if (!status.ok()) {
    std::string msg(status.message().substr(0, kFdChannelMaxMessage));
    resp.code = static_cast<uint32_t>(status.code());
    resp.message_len = static_cast<uint32_t>(msg.size());
    reply.bytes.assign(reinterpret_cast<const char*>(&resp), sizeof(resp));
    reply.bytes += msg;
  } else {
    reply.bytes.assign(reinterpret_cast<const char*>(&resp), sizeof(resp));
  }
  const bool sent = send(reply);
  if (reply.fd >= 0) close(reply.fd);
  if (reply.fd2 >= 0) close(reply.fd2);
  return sent;
}

}  // namespace

absl::Status RingsOffError() {
  return absl::FailedPreconditionError("request rings are off (--request_rings=false)");
}

Preface ClassifyPreface(const char* bytes, size_t n) {
  const size_t k = n < 4 ? n : 4;
  const bool grpc = memcmp(bytes, "PRI ", k) == 0;
  const bool slab = memcmp(bytes, kFdChannelMagic, k) == 0;
  if (k < 4) return grpc || slab ? Preface::kNeedMore : Preface::kUnknown;
  if (grpc) return Preface::kGrpc;
  if (slab) return Preface::kSlabChannel;
  return Preface::kUnknown;
}

bool ServeSlabChannel(MemoryBroker* broker, SlabChannelConn& conn, absl::string_view data,
                      const std::function<bool(const SlabChannelReply&)>& send,
                      RingLender* rings) {
  conn.in.append(data.data(), data.size());
  size_t used = 0;
  bool open = true;
  while (open && conn.in.size() - used >= sizeof(SlabRequest)) {
    SlabRequest req;
    memcpy(&req, conn.in.data() + used, sizeof(req));
    // kRebind carries its token after the header (slab_id: its length).
    uint64_t extra = 0;
    if (static_cast<SlabOp>(req.op) == SlabOp::kRebind) {
      if (req.slab_id == 0 || req.slab_id > kFdChannelMaxMessage) {
        open = false;
        break;
      }
      extra = req.slab_id;
    }
    if (conn.in.size() - used < sizeof(req) + extra) break;  // the rest comes later
    const absl::string_view payload =
        absl::string_view(conn.in).substr(used + sizeof(req), extra);
    open = Answer(broker, conn, req, payload, send, rings);
    used += sizeof(req) + extra;
  }
  conn.in.erase(0, used);
  return open;
}

}  // namespace gpumem
