// oracle_probe: run as a non-admin uid against a live gpumemd, asks about
// another uid's allocation, slab and session token, and about ones that
// do not exist, in pairs through every method that takes an id, and prints
// one line per pair: "same WHAT" when the two answers (status and message,
// each id masked) are alike, else "differ WHAT: ANSWER | ANSWER". Then
// "stats ok" and what GetStats with slabs shows of the other (its slab's
// id, a session of another uid), and "done".
//   oracle_probe --socket=S --alloc=ID --slab=ID --offset=N --size=N
//                --tenant=NAME --token=HEX
// With --hello (the other uid, in a pid namespace of its own): says hello
// on the slab channel, prints "token HEX" and keeps the session.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/fd_channel.h"
#include "proto/gpumem/v1/gpumem.grpc.pb.h"

ABSL_FLAG(std::string, socket, "", "daemon socket");
ABSL_FLAG(uint64_t, alloc, 0, "another uid's live allocation");
ABSL_FLAG(uint64_t, slab, 0, "its slab");
ABSL_FLAG(uint64_t, offset, 0, "its offset");
ABSL_FLAG(uint64_t, size, 0, "its size");
ABSL_FLAG(std::string, tenant, "", "its tenant's name");
ABSL_FLAG(std::string, token, "", "another uid's connection-bound session token");
ABSL_FLAG(bool, hello, false, "keep a connection-bound session; print its token");

namespace gpumem {
namespace {

constexpr uint64_t kBogus = 1000003;  // added to an id: one nobody has

std::string Masked(int code, std::string message, const std::string& id) {
  if (!id.empty()) message = absl::StrReplaceAll(message, {{id, "<id>"}});
  return absl::StrCat(code, " ", message);
}

void Pair(const std::string& what, const std::string& a, const std::string& b) {
  if (a == b) {
    std::printf("same %s\n", what.c_str());
  } else {
    std::printf("differ %s: %s | %s\n", what.c_str(), a.c_str(), b.c_str());
  }
  std::fflush(stdout);
}

std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token = "") {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) ctx->AddMetadata(kSessionTokenHeader, token);
  return ctx;
}

std::string StatusText(const absl::Status& s, const std::string& id) {
  return Masked(static_cast<int>(s.code()), std::string(s.message()), id);
}

int Run() {
  const std::string socket = absl::GetFlag(FLAGS_socket);
  if (absl::GetFlag(FLAGS_hello)) {
    absl::StatusOr<int> ch = ConnectFdChannel(socket);
    absl::StatusOr<std::string> token = ch.ok() ? HelloFdChannel(*ch) : ch.status();
    std::printf("token %s\n", token.ok() ? token->c_str() : token.status().ToString().c_str());
    std::fflush(stdout);
    for (;;) pause();
  }
  const uint64_t alloc = absl::GetFlag(FLAGS_alloc), slab = absl::GetFlag(FLAGS_slab);
  auto stub = v1::GpuMemory::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  // This process's own slab channel; its hello gives a token when the
  // daemon cannot see this process's pid, sent with every call then.
  absl::StatusOr<int> ch = ConnectFdChannel(socket);
  if (!ch.ok()) {
    std::printf("no slab channel: %s\n", ch.status().ToString().c_str());
    return 1;
  }
  const std::string own = HelloFdChannel(*ch).value_or("");

  // Free, unary and on the Stream.
  auto free_unary = [&](uint64_t id) {
    v1::FreeRequest r;
    r.set_id(id);
    v1::FreeResponse out;
    grpc::Status s = stub->Free(Ctx(own).get(), r, &out);
    return Masked(s.error_code(), s.error_message(), std::to_string(id));
  };
  Pair("Free", free_unary(alloc), free_unary(alloc + kBogus));
  {
    auto ctx = Ctx(own);
    auto stream = stub->Stream(ctx.get());
    auto free_stream = [&](uint64_t id, uint64_t request_id) {
      v1::StreamRequest r;
      r.set_request_id(request_id);
      r.mutable_free()->set_id(id);
      v1::StreamReply reply;
      if (!stream->Write(r) || !stream->Read(&reply)) return std::string("stream broke");
      return Masked(reply.answer().status().code(), reply.answer().status().message(),
                    std::to_string(id));
    };
    Pair("Stream Free", free_stream(alloc, 1), free_stream(alloc + kBogus, 2));
    stream->WritesDone();
    stream->Finish();
  }
  // The slab channel: open, close, give back.
  auto open_slab = [&](uint64_t id) {
    absl::StatusOr<SlabFd> fd = RequestSlabFd(*ch, id);
    if (fd.ok()) close(fd->fd);
    return StatusText(fd.status(), std::to_string(id));
  };
  Pair("slab channel OPEN", open_slab(slab), open_slab(slab + kBogus));
  auto close_slab = [&](uint64_t id) {
    return StatusText(CloseSlabFd(*ch, id), std::to_string(id));
  };
  Pair("slab channel CLOSE", close_slab(slab), close_slab(slab + kBogus));
  auto give_slab = [&](uint64_t id) {
    const int fd = memfd_create("oracle", MFD_CLOEXEC);
    ftruncate(fd, 1 << 20);
    absl::Status s = GiveSlabFd(*ch, id, fd);
    close(fd);
    return StatusText(s, std::to_string(id));
  };
  Pair("slab channel GIVE_SLAB", give_slab(slab), give_slab(slab + kBogus));
  // Resume: the other's block exactly as it is, and one that does not exist.
  auto resume = [&](uint64_t id, uint64_t slab_id) {
    v1::ResumeRequest r;
    v1::Allocation* a = r.add_allocations();
    a->set_id(id);
    a->set_slab_id(slab_id);
    a->set_offset(absl::GetFlag(FLAGS_offset));
    a->set_size_bytes(absl::GetFlag(FLAGS_size));
    v1::ResumeResponse out;
    grpc::Status s = stub->Resume(Ctx(own).get(), r, &out);
    std::string text = Masked(s.error_code(), s.error_message(), "");
    absl::StrAppend(&text, " kept ", out.kept_size());
    for (const v1::LostAllocation& l : out.lost()) {
      absl::StrAppend(&text, " lost ", Masked(l.status().code(), l.status().message(),
                                              std::to_string(id)));
    }
    return absl::StrReplaceAll(text, {{std::to_string(slab_id), "<slab>"}});
  };
  Pair("Resume", resume(alloc, slab), resume(alloc + kBogus, slab + kBogus));
  // The ledger of another tenant, and of one that does not exist.
  auto ledger = [&](const std::string& tenant) {
    v1::GetLedgerRequest r;
    r.set_tenant(tenant);
    v1::GetLedgerResponse out;
    grpc::Status s = stub->GetLedger(Ctx(own).get(), r, &out);
    return Masked(s.error_code(), s.error_message(), tenant);
  };
  const std::string tenant = absl::GetFlag(FLAGS_tenant);
  Pair("GetLedger", ledger(tenant), ledger(tenant + "-none"));
  // Another's session token, and a made-up one: GetSession, and REBIND
  // (when the other has one: a connection-bound session).
  const std::string token = absl::GetFlag(FLAGS_token);
  if (!token.empty()) {
    std::string bogus_token = token;
    for (char& c : bogus_token) c = c == '0' ? '1' : '0';
    auto get_session = [&](const std::string& t) {
      v1::Session out;
      grpc::Status s = stub->GetSession(Ctx(t).get(), v1::GetSessionRequest(), &out);
      return absl::StrCat(Masked(s.error_code(), s.error_message(), t), " session ",
                          s.ok() ? "own" : "none", s.ok() && out.uid() != getuid() ? " OTHER" : "");
    };
    Pair("GetSession with a token", get_session(token), get_session(bogus_token));
    auto rebind = [&](const std::string& t) {
      absl::StatusOr<int> c = ConnectFdChannel(socket);
      if (!c.ok()) return std::string("no channel");
      absl::Status s = RebindFdChannel(*c, t);
      close(*c);
      return StatusText(s, t);
    };
    Pair("slab channel REBIND", rebind(token), rebind(bogus_token));
  }
  // What GetStats shows: none of the other's ids.
  v1::GetStatsRequest sr;
  sr.set_include_slabs(true);
  v1::GetStatsResponse stats;
  grpc::Status s = stub->GetStats(Ctx(own).get(), sr, &stats);
  bool shows_slab = false, other_session = false;
  for (const v1::DeviceStats& d : stats.devices()) {
    for (const v1::SlabStats& sl : d.slabs()) shows_slab = shows_slab || sl.slab_id() == slab;
  }
  for (const v1::SessionStats& ss : stats.sessions()) {
    other_session = other_session || ss.uid() != getuid();
  }
  std::printf("stats %s%s%s\n", s.ok() ? "ok" : "error", shows_slab ? " shows-slab" : "",
              other_session ? " shows-another-session" : "");
  close(*ch);
  std::printf("done\n");
  return 0;
}

}  // namespace
}  // namespace gpumem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gpumem::Run();
}
