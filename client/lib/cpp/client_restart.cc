// Client's restart thread: notices that the daemon went away (the slab
// channel, its lifeline, hangs up), reconnects at once and keeps trying
// with a short backoff, then re-presents this process's session and every
// live block to the new daemon (Resume), hands back the handles of slabs
// it lacks (GIVE_SLAB), and only then lets calls through again.
//
// Invariants: the re-presenting runs with Impl::calls held exclusively, so
// every answer a call got from the old daemon is in `live` (or out of it)
// before the snapshot is taken, and no call reaches the new daemon before
// it knows what this process holds. A block is "lost" only on the daemon's
// word (ResumeResponse.lost, or a daemon that keeps nothing).
#include <errno.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/lib/cpp/client_impl.h"
#include "common/grpc_status.h"

namespace gpumem {
namespace client {

namespace {

// Blocks re-presented per Resume call.
constexpr size_t kResumePageBlocks = 1000;
// Resumes refused RESOURCE_EXHAUSTED that are tried again.
constexpr int kBusyRetries = 20;

// Sleeps `d` unless the Client is being destroyed; false then.
bool Nap(Client::Impl& impl, absl::Duration d) {
  struct pollfd p = {impl.wake_fd, POLLIN, 0};
  poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(d)) + 1);
  absl::MutexLock lock(&impl.restart_mu);
  return !impl.stopping;
}

}  // namespace

void Client::WatchLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&impl_->restart_mu);
      if (impl_->stopping) return;
    }
    // Held while polling: its fd cannot be closed and reused meanwhile.
    std::shared_ptr<DaemonLink> link = impl_->Link();
    struct pollfd p[2] = {{link->lifeline(), POLLRDHUP, 0}, {impl_->wake_fd, POLLIN, 0}};
    int n = poll(p, 2, -1);
    if (n < 0 && errno == EINTR) continue;
    if (p[1].revents != 0) {
      uint64_t v;
      (void)!read(impl_->wake_fd, &v, sizeof(v));
      continue;  // stopping is checked above
    }
    if ((p[0].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0) {
      if (link->SaidGoodbye()) DaemonStopped();
      link.reset();
      Reconnect();
    }
  }
}

void Client::DaemonStopped() {
  Impl& impl = *impl_;
  RestartReport report;
  std::function<void(const RestartReport&)> on_restart;
  {
    absl::WriterMutexLock calls(&impl.calls);
    absl::MutexLock lock(&impl.mu);
    for (const auto& [id, a] : impl.live) {
      absl::Status why = absl::NotFoundError(absl::StrCat("allocation ", id, ": ",
                                                          kFdChannelGoodbye));
      if (impl.freeing.contains(id)) {
        impl.freed_meanwhile.insert(id);
      } else {
        impl.lost[id] = why;
        report.lost.emplace_back(id, why);
      }
    }
    impl.live.clear();
    on_restart = impl.on_restart;
    // Calls fail at once from now on, until a daemon is back.
    absl::MutexLock r(&impl.restart_mu);
    impl.restarting = true;
    impl.gone = true;
    impl.gone_why = absl::StrCat(kFdChannelGoodbye, " (", impl.socket_path,
                                 "); the library reconnects when a daemon is back");
  }
  if (on_restart) on_restart(report);
}

void Client::Reconnect() {
  Impl& impl = *impl_;
  const absl::Time began = absl::Now();
  {
    absl::MutexLock lock(&impl.restart_mu);
    impl.restarting = true;
  }
  const std::string old_token = impl.Link()->session_token();
  DaemonRetryBackoff backoff;
  auto wait_more = [&] { return Nap(impl, backoff.Next()); };
  int busy = 0;  // Resumes refused RESOURCE_EXHAUSTED so far
  for (;;) {
    {
      absl::MutexLock lock(&impl.restart_mu);
      if (impl.stopping) return;
    }
    bool rebound = false;
    absl::StatusOr<std::shared_ptr<DaemonLink>> link =
        DaemonLink::Open(impl.socket_path, old_token, &rebound);
    if (!link.ok()) {
      if (!wait_more()) return;
      continue;
    }
    RestartReport report;
    std::function<void(const RestartReport&)> on_restart;
    {
      absl::WriterMutexLock calls(&impl.calls);
      std::vector<v1::Allocation> held;
      uint64_t session_id = 0;
      {
        absl::MutexLock lock(&impl.mu);
        session_id = impl.session_id;
        for (const auto& [id, a] : impl.live) held.push_back(a);
      }
      // In pages of kResumePageBlocks, well within the daemon's limit on a
      // Resume (256 KiB: server/service/message_limits.h). Each page claims
      // its own blocks; what no page claims is freed only at the end of the
      // daemon's grace time, so the pages add up to one Resume.
      v1::ResumeResponse answer;
      absl::Status s;
      absl::flat_hash_set<uint64_t> need;
      size_t next = 0;
      do {
        v1::ResumeRequest request;
        request.set_session_id(session_id);
        const size_t end = std::min(held.size(), next + kResumePageBlocks);
        for (; next < end; ++next) *request.add_allocations() = held[next];
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        (*link)->Prepare(&ctx);
        v1::ResumeResponse page;
        s = FromGrpcStatus((*link)->stub()->Resume(&ctx, request, &page));
        if (!s.ok()) break;
        answer.set_session_id(page.session_id());
        answer.mutable_kept()->MergeFrom(page.kept());
        answer.mutable_lost()->MergeFrom(page.lost());
        for (uint64_t slab : page.needs_handle()) {
          if (need.insert(slab).second) answer.add_needs_handle(slab);
        }
        answer.set_unclaimed(page.unclaimed());
      } while (next < held.size());
      // Not serving yet, gone again, or busy (its query budget, while other
      // processes resume; a limit that never lets the page through is given
      // up on after kBusyRetries): a new link, after a while.
      if (s.code() == absl::StatusCode::kUnavailable ||
          s.code() == absl::StatusCode::kDeadlineExceeded ||
          (s.code() == absl::StatusCode::kResourceExhausted && ++busy <= kBusyRetries)) {
        if (!wait_more()) return;
        continue;
      }
      std::vector<std::pair<uint64_t, absl::Status>> lost;
      std::vector<std::pair<uint64_t, int>> give;  // slab, its handle (dup)
      {
        absl::MutexLock lock(&impl.mu);
        if (!s.ok()) {
          // A daemon that cannot take anything back: every block is lost.
          const absl::Status why =
              s.code() == absl::StatusCode::kUnimplemented
                  ? absl::NotFoundError(absl::StrCat(
                        "gpumemd restarted and does not carry allocations over a restart (",
                        s.message(), ")"))
                  : s;
          for (const auto& [id, a] : impl.live) lost.emplace_back(id, why);
        } else {
          impl.session_id = answer.session_id();
          for (uint64_t id : answer.kept()) report.kept.push_back(id);
          for (const v1::LostAllocation& l : answer.lost()) {
            lost.emplace_back(l.id(),
                              absl::Status(static_cast<absl::StatusCode>(l.status().code()),
                                           l.status().message()));
          }
          for (uint64_t slab : answer.needs_handle()) {
            auto it = impl.slabs.find(slab);
            if (it == impl.slabs.end() || it->second.slab->handle_fd() < 0) continue;
            const int fd = dup(it->second.slab->handle_fd());
            if (fd >= 0) give.emplace_back(slab, fd);
          }
        }
        for (const auto& [id, why] : lost) {
          impl.live.erase(id);
          if (impl.freeing.contains(id)) {
            impl.freed_meanwhile.insert(id);  // its Free was carried out
          } else {
            impl.lost[id] = why;
            report.lost.emplace_back(id, why);
          }
        }
        on_restart = impl.on_restart;
      }
      for (const auto& [slab, fd] : give) {
        (*link)->GiveSlab(slab, fd).IgnoreError();  // a refusal: its blocks close later
        close(fd);
      }
      std::function<void(const v1::ReclaimRequest&)> on_reclaim;
      {
        absl::MutexLock lock(&impl.mu);
        on_reclaim = impl.on_reclaim;
      }
      if (on_reclaim) {
        (*link)->stream()->StartPushReader([on_reclaim](const v1::StreamReply& push) {
          if (push.has_reclaim()) on_reclaim(push.reclaim());
        });
      }
      {
        absl::MutexLock lock(&impl.link_mu);
        impl.link = *link;
      }
      // Told before any call goes on: a pool drops lost leases first.
      report.took = absl::Now() - began;
      if (on_restart) on_restart(report);
      absl::MutexLock lock(&impl.restart_mu);
      impl.restarting = false;
      impl.gone = false;
      ++impl.restarts;
    }
    return;
  }
}

}  // namespace client
}  // namespace gpumem
