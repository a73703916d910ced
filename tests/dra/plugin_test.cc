// gpumemd-dra end to end without a cluster: the plugin binary between a fake
// kubelet (its gRPC peer on the registration and DRA sockets), a fake API
// server (claims served, ResourceSlice writes recorded) and gpumemd behind
// the GpumemdPeer seam. Built twice: plugin_test against the in-process
// double, plugin_real_daemon_test against //server:gpumemd (skipped until
// the daemon serves PutTenant; tests that need the double's recordings or
// misbehaviour skip there).
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <sstream>

#include <google/protobuf/text_format.h>
#include <google/protobuf/util/message_differencer.h>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/dra/atomic_file.h"
#include "gtest/gtest.h"
#include "tests/dra/fake_gpumemd.h"
#include "tests/dra/plugin_fixture.h"
#include "tests/integration/daemon_fixture.h"

namespace gpumem {
namespace dra {
namespace testing {
namespace {

using google::protobuf::util::MessageDifferencer;
using nlohmann::json;

constexpr uint64_t kMiB = uint64_t{1} << 20, kGiB = uint64_t{1} << 30;

class DraPluginTest : public DraPluginFixture {};

std::string Text(const google::protobuf::Message& m) {
  std::string s;
  google::protobuf::TextFormat::PrintToString(m, &s);
  return s;
}

// The quota on device `index`, 0 if none.
uint64_t DeviceQuota(const v1::TenantStats& t, uint32_t index) {
  for (const v1::DeviceQuota& d : t.quota().devices()) {
    if (d.device() == absl::StrCat(index)) return d.bytes();
  }
  return 0;
}

TEST_F(DraPluginTest, RegistersAsDraDriverWithBothNodeServiceVersions) {
  StartPlugin();
  FakeKubelet k;
  absl::StatusOr<pluginregistration::PluginInfo> info = k.Register(registration_socket_);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->type(), "DRAPlugin");
  EXPECT_EQ(info->name(), kDriver);
  EXPECT_EQ(info->endpoint(), plugin_dir_ + "/dra.sock");
  ASSERT_EQ(info->supported_versions_size(), 2);
  EXPECT_EQ(info->supported_versions(0), "v1.DRAPlugin");
  EXPECT_EQ(info->supported_versions(1), "v1beta1.DRAPlugin");
  // A refused registration is acknowledged (and logged), not an error.
  FakeKubelet refusing;
  ASSERT_TRUE(refusing.Register(registration_socket_, /*accept=*/false).ok());
  EXPECT_TRUE(api_->WaitFor([&] { return absl::StrContains(PluginLog(), "refused"); },
                            absl::Seconds(5)));
  // SIGTERM deregisters: the registration socket goes away.
  EXPECT_EQ(StopPlugin(), 0);
  struct stat st;
  EXPECT_NE(stat(registration_socket_.c_str(), &st), 0);
}

TEST_F(DraPluginTest, PrepareMakesTenantSocketAndCdiSpec) {
  StartPlugin();
  const ClaimRef c = AddClaim("gpumem-8g", {{"mem", DeviceName(0), "3Gi"}});
  absl::StatusOr<drapb::NodePrepareResourcesResponse> r = kubelet_.Prepare({c});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->claims().count(c.uid), 1u);
  const drapb::NodePrepareResourceResponse& e = r->claims().at(c.uid);
  ASSERT_EQ(e.error(), "");
  ASSERT_EQ(e.devices_size(), 1);
  EXPECT_EQ(e.devices(0).pool_name(), kNode);
  EXPECT_EQ(e.devices(0).device_name(), DeviceName(0));
  ASSERT_EQ(e.devices(0).request_names_size(), 1);
  EXPECT_EQ(e.devices(0).request_names(0), "mem");
  ASSERT_EQ(e.devices(0).cdi_device_ids_size(), 1);
  EXPECT_EQ(e.devices(0).cdi_device_ids(0), std::string(kDriver) + "/claim=" + c.uid);

  // The tenant, with the consumed capacity as its quota on that device.
  absl::StatusOr<std::unique_ptr<v1::TenantStats>> t = peer_->Tenant("claim-" + c.uid);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_NE(*t, nullptr) << "no tenant claim-" << c.uid;
  EXPECT_EQ(DeviceQuota(**t, 0), 3 * kGiB);
  EXPECT_EQ((*t)->quota().total_bytes(), 3 * kGiB);
  // Its socket, alone in the claim's directory under the claims directory.
  struct stat st;
  ASSERT_EQ(lstat((SocketDir(c) + "/gpumemd.sock").c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  // The CDI spec mounts that directory where the client library looks.
  absl::StatusOr<std::string> spec_text = ReadWholeFile(CdiSpec(c));
  ASSERT_TRUE(spec_text.ok()) << spec_text.status();
  const json spec = json::parse(*spec_text);
  EXPECT_EQ(spec["kind"], std::string(kDriver) + "/claim");
  ASSERT_EQ(spec["devices"].size(), 1u);
  EXPECT_EQ(spec["devices"][0]["name"], c.uid);
  const json& edits = spec["devices"][0]["containerEdits"];
  EXPECT_EQ(edits["env"], json({"GPUMEMD_SOCKET=/run/gpumemd/gpumemd.sock"}));
  ASSERT_EQ(edits["mounts"].size(), 1u);
  EXPECT_EQ(edits["mounts"][0]["hostPath"], SocketDir(c));
  EXPECT_EQ(edits["mounts"][0]["containerPath"], "/run/gpumemd");
  // The API server was asked with the service-account token.
  bool asked = false;
  for (const FakeApiServer::Request& q : api_->Requests()) {
    if (q.method == "GET" && absl::EndsWith(q.path, "/namespaces/team-a/resourceclaims/gpumem-8g")) {
      asked = true;
      EXPECT_EQ(q.authorization, "Bearer test-token-1");
    }
  }
  EXPECT_TRUE(asked);
  EXPECT_EQ(StateFile()["claims"][c.uid]["phase"], "prepared");
}

TEST_F(DraPluginTest, ClaimOnTwoDevicesGetsAQuotaOnEach) {
  StartPlugin();
  const ClaimRef c = AddClaim("two", {{"a", DeviceName(0), "1Gi"}, {"b", DeviceName(1), "512Mi"}});
  absl::StatusOr<drapb::NodePrepareResourcesResponse> r = kubelet_.Prepare({c});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->claims().at(c.uid).error(), "");
  EXPECT_EQ(r->claims().at(c.uid).devices_size(), 2);
  absl::StatusOr<std::unique_ptr<v1::TenantStats>> t = peer_->Tenant("claim-" + c.uid);
  ASSERT_TRUE(t.ok() && *t != nullptr);
  EXPECT_EQ(DeviceQuota(**t, 0), kGiB);
  EXPECT_EQ(DeviceQuota(**t, 1), 512 * kMiB);
  EXPECT_EQ((*t)->quota().total_bytes(), kGiB + 512 * kMiB);
}

TEST_F(DraPluginTest, PrepareTwiceGivesTheSameAnswer) {
  StartPlugin();
  const ClaimRef c = AddClaim("again", {{"mem", DeviceName(1), "1Gi"}});
  absl::StatusOr<drapb::NodePrepareResourcesResponse> first = kubelet_.Prepare({c});
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->claims().at(c.uid).error(), "");
  absl::StatusOr<drapb::NodePrepareResourcesResponse> second = kubelet_.Prepare({c});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*first, *second))
      << Text(*first) << "\nvs\n" << Text(*second);
  // The kubelet of another version asks the same: the same answer.
  absl::StatusOr<drapb_beta::NodePrepareResourcesResponse> beta = kubelet_.PrepareV1beta1({c});
  ASSERT_TRUE(beta.ok()) << beta.status();
  drapb::NodePrepareResourcesResponse beta_as_v1;
  ASSERT_TRUE(beta_as_v1.ParseFromString(beta->SerializeAsString()));
  EXPECT_TRUE(MessageDifferencer::Equals(*first, beta_as_v1)) << Text(beta_as_v1);
  // One tenant, one spec; the claim was read from the API server once.
  absl::StatusOr<v1::GetStatsResponse> s = peer_->Stats();
  ASSERT_TRUE(s.ok());
  int tenants = 0;
  for (const v1::TenantStats& t : s->tenants()) tenants += t.name() == "claim-" + c.uid;
  EXPECT_EQ(tenants, 1);
  int gets = 0;
  for (const FakeApiServer::Request& q : api_->Requests()) gets += q.method == "GET";
  EXPECT_EQ(gets, 1);
  if (FakeGpumemd* fake = peer_->fake()) {
    std::vector<std::string> puts;
    for (const FakeGpumemd::Call& call : fake->Calls()) {
      if (call.method == "PutTenant") puts.push_back(call.request);
    }
    ASSERT_EQ(puts.size(), 3u);  // each re-asserts the same tenant, idempotently
    EXPECT_EQ(puts[0], puts[1]);
    EXPECT_EQ(puts[0], puts[2]);
  }
}

TEST_F(DraPluginTest, UnprepareEndsTheTenantAndRemovesItsSocketAndSpec) {
  StartPlugin();
  const ClaimRef c = AddClaim("gone", {{"mem", DeviceName(0), "1Gi"}});
  ASSERT_EQ(kubelet_.Prepare({c})->claims().at(c.uid).error(), "");
  if (FakeGpumemd* fake = peer_->fake()) {
    // A live session holding memory: unprepare must end it, not refuse.
    fake->SetTenantUsage("claim-" + c.uid, 0, 256 * kMiB);
  }
  absl::StatusOr<drapb::NodeUnprepareResourcesResponse> u = kubelet_.Unprepare({c});
  ASSERT_TRUE(u.ok()) << u.status();
  ASSERT_EQ(u->claims().count(c.uid), 1u);
  EXPECT_EQ(u->claims().at(c.uid).error(), "");
  ExpectNothingMadeFor(c);
  if (FakeGpumemd* fake = peer_->fake()) {
    const std::vector<FakeGpumemd::Call> calls = fake->Calls();
    ASSERT_FALSE(calls.empty());
    EXPECT_EQ(calls.back().method, "DeleteTenant");
    EXPECT_TRUE(absl::StrContains(calls.back().request, "end_sessions: true")) << calls.back().request;
  }
  // Again, and a claim never prepared: answered, without error.
  const ClaimRef never{"team-a", "never", "0badc0de-0000-4000-8000-000000000000"};
  u = kubelet_.Unprepare({c, never});
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->claims().size(), 2u);
  EXPECT_EQ(u->claims().at(c.uid).error(), "");
  EXPECT_EQ(u->claims().at(never.uid).error(), "");
}

TEST_F(DraPluginTest, PublishedSliceMatchesGoldenFileAndFollowsCapacity) {
  StartPlugin();
  ASSERT_TRUE(api_->WaitFor([&] { return !api_->SliceWrites().empty(); }, absl::Seconds(10)))
      << PluginLog();
  const FakeApiServer::Request first = api_->SliceWrites().front();
  EXPECT_EQ(first.path, "/apis/resource.k8s.io/v1/resourceslices/node-a-gpumemd.io");
  EXPECT_EQ(first.query, "fieldManager=gpumemd-dra&force=true");
  EXPECT_EQ(first.content_type, "application/apply-patch+yaml");
  absl::StatusOr<std::string> golden =
      ReadWholeFile(gpumem::testing::RunfilePath("tests/dra/testdata/resource_slice.golden.json"));
  ASSERT_TRUE(golden.ok()) << golden.status();
  const json want = json::parse(*golden);
  const json got = json::parse(first.body);
  EXPECT_EQ(got, want) << "published:\n" << got.dump(2) << "\ngolden:\n" << want.dump(2);

  // Memory held outside claims on device 1 shrinks what claims can get.
  ASSERT_TRUE(peer_->HoldOutsideClaims(1, 512 * kMiB).ok());
  ASSERT_TRUE(api_->WaitFor(
      [&] {
        const auto w = api_->SliceWrites();
        return json::parse(w.back().body)["spec"]["pool"]["generation"] == 2;
      },
      absl::Seconds(10)))
      << PluginLog();
  const json next = json::parse(api_->SliceWrites().back().body);
  json expect = want;
  expect["spec"]["pool"]["generation"] = 2;
  expect["spec"]["devices"][1]["capacity"]["memory"]["value"] = "1536Mi";
  EXPECT_EQ(next, expect) << next.dump(2);
  // Nothing changes: nothing is written (resync is an hour here).
  const size_t writes = api_->SliceWrites().size();
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(api_->SliceWrites().size(), writes);
}

TEST_F(DraPluginTest, RestartKeepsPreparedClaims) {
  StartPlugin();
  const ClaimRef c = AddClaim("kept", {{"mem", DeviceName(0), "2Gi"}});
  absl::StatusOr<drapb::NodePrepareResourcesResponse> before = kubelet_.Prepare({c});
  ASSERT_TRUE(before.ok() && before->claims().at(c.uid).error() == "");
  ASSERT_TRUE(api_->WaitFor([&] { return !api_->SliceWrites().empty(); }, absl::Seconds(10)));
  const int64_t generation = json::parse(api_->SliceWrites().back().body)["spec"]["pool"]["generation"];
  // Killed hard, and the claim is no longer readable (the API server may
  // be down when the plugin comes back): the record answers.
  EXPECT_EQ(StopPlugin(/*kill9=*/true), -SIGKILL);
  api_->RemoveClaim(c.ns, c.name);
  // As after a node's reboot: the kubelet made the claims' hostPath again,
  // 0755. Before the claim's socket is asserted again, it is 0700.
  const std::string claims_dir = SocketDir(c).substr(0, SocketDir(c).rfind('/'));
  ASSERT_EQ(chmod(claims_dir.c_str(), 0755), 0);
  StartPlugin();
  absl::StatusOr<drapb::NodePrepareResourcesResponse> after = kubelet_.Prepare({c});
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*before, *after)) << Text(*after);
  struct stat st;
  ASSERT_EQ(stat(claims_dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u) << "the claims directory was left open";
  // The slice's generation only grows across restarts.
  ASSERT_TRUE(api_->WaitFor(
      [&] {
        return json::parse(api_->SliceWrites().back().body)["spec"]["pool"]["generation"] >
               generation;
      },
      absl::Seconds(10)));
  // And the restarted plugin can undo what the old one made.
  absl::StatusOr<drapb::NodeUnprepareResourcesResponse> u = kubelet_.Unprepare({c});
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->claims().at(c.uid).error(), "");
  ExpectNothingMadeFor(c);
}

TEST_F(DraPluginTest, CrashMidPrepareIsFinishedOrUndone) {
  // A state file whose claim is PREPARING (the plugin died after recording
  // the plan): the next prepare finishes it without the API server.
  StartPlugin();
  const ClaimRef c = AddClaim("half", {{"mem", DeviceName(0), "1Gi"}});
  ASSERT_EQ(kubelet_.Prepare({c})->claims().at(c.uid).error(), "");
  ASSERT_EQ(StopPlugin(), 0);
  json state = StateFile();
  state["claims"][c.uid]["phase"] = "preparing";
  ASSERT_TRUE(WriteFileAtomically(state_file_, state.dump()).ok());
  ASSERT_TRUE(RemoveFileDurably(CdiSpec(c)).ok());
  api_->RemoveClaim(c.ns, c.name);
  StartPlugin();
  absl::StatusOr<drapb::NodePrepareResourcesResponse> r = kubelet_.Prepare({c});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->claims().at(c.uid).error(), "");
  struct stat st;
  EXPECT_EQ(stat(CdiSpec(c).c_str(), &st), 0);
  EXPECT_EQ(StateFile()["claims"][c.uid]["phase"], "prepared");
  // A PREPARING record is also undone by unprepare.
  ASSERT_EQ(StopPlugin(), 0);
  state = StateFile();
  state["claims"][c.uid]["phase"] = "preparing";
  ASSERT_TRUE(WriteFileAtomically(state_file_, state.dump()).ok());
  StartPlugin();
  ASSERT_EQ(kubelet_.Unprepare({c})->claims().at(c.uid).error(), "");
  ExpectNothingMadeFor(c);
}

TEST_F(DraPluginTest, UnknownDeviceIsRefusedAndNothingIsMade) {
  StartPlugin();
  const ClaimRef c = AddClaim("nodev", {{"mem", "gpu-51999999-dead-4000-8000-000000000000", "1Gi"}});
  absl::StatusOr<drapb::NodePrepareResourcesResponse> r = kubelet_.Prepare({c});
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string& err = r->claims().at(c.uid).error();
  EXPECT_TRUE(absl::StartsWith(err, "INVALID_ARGUMENT")) << err;
  EXPECT_TRUE(absl::StrContains(err, "gpu-51999999-dead-4000-8000-000000000000")) << err;
  EXPECT_TRUE(absl::StrContains(err, "does not have")) << err;
  EXPECT_TRUE(absl::StrContains(err, DeviceName(0))) << err;  // what it does have
  EXPECT_EQ(r->claims().at(c.uid).devices_size(), 0);
  ExpectNothingMadeFor(c);
}

TEST_F(DraPluginTest, MoreMemoryThanTheDeviceHasIsRefused) {
  StartPlugin();
  // Device 1 has 2 GiB: 3 GiB in one result, or 1.5 GiB twice.
  const ClaimRef big = AddClaim("big", {{"mem", DeviceName(1), "3Gi"}});
  const ClaimRef twice = AddClaim("twice", {{"a", DeviceName(1), "1536Mi"}, {"b", DeviceName(1), "1536Mi"}});
  absl::StatusOr<drapb::NodePrepareResourcesResponse> r = kubelet_.Prepare({big, twice});
  ASSERT_TRUE(r.ok()) << r.status();
  for (const ClaimRef& c : {big, twice}) {
    const std::string& err = r->claims().at(c.uid).error();
    EXPECT_TRUE(absl::StartsWith(err, "INVALID_ARGUMENT")) << err;
    EXPECT_TRUE(absl::StrContains(err, "which has 2Gi")) << err;
    ExpectNothingMadeFor(c);
  }
  EXPECT_TRUE(absl::StrContains(r->claims().at(big.uid).error(), "asks for 3Gi"));
  EXPECT_TRUE(absl::StrContains(r->claims().at(twice.uid).error(), "asks for 3Gi"));
}

TEST_F(DraPluginTest, MalformedClaimsGetAClearErrorEachAndTheGoodOneIsPrepared) {
  StartPlugin();
  const std::string dev = DeviceName(0);
  std::vector<ClaimRef> refs;
  std::vector<std::string> expects;
  // A claim `name` whose body is a good claim with `edit` applied to it
  // (or `raw` when given), and the words its error must contain.
  auto add = [&](const std::string& name, const std::function<void(json&)>& edit,
                 const std::string& expect, const std::string& raw = "") {
    const ClaimRef ref{"team-a", name,
                       absl::StrCat("bad00000-0000-4000-8000-0000000000", 10 + refs.size())};
    json j = json::parse(ClaimJson(ref, {{"mem", dev, "1Gi"}}));
    if (edit) edit(j);
    api_->SetClaim(ref.ns, ref.name, raw.empty() ? j.dump() : raw);
    refs.push_back(ref);
    expects.push_back(expect);
  };
  using R = json&;
  add("not-json", nullptr, "not a JSON object", "{\"metadata\": {");
  add("array", nullptr, "not a JSON object", "[1,2]");
  add("no-uid", [](R j) { j["metadata"].erase("uid"); }, "metadata.uid is missing");
  add("other-uid", [](R j) { j["metadata"]["uid"] = "ffffffff-0000-4000-8000-000000000000"; },
      "the claim was deleted and created again");
  add("unallocated", [](R j) { j.erase("status"); }, "is not allocated");
  add("results-object", [](R j) { j["status"]["allocation"]["devices"]["results"] = json::object(); },
      "results is not a list");
  add("bad-quantity",
      [](R j) { j["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]["memory"] = "lots"; },
      "\"lots\" is not a byte quantity");
  add("negative-quantity",
      [](R j) { j["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]["memory"] = "-1Gi"; },
      "negative");
  add("huge-quantity",
      [](R j) { j["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]["memory"] = "20Ei"; },
      "larger than 2^64 bytes");
  add("number-quantity",
      [](R j) { j["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]["memory"] = 1073741824; },
      "is not a quantity string");
  add("other-pool", [](R j) { j["status"]["allocation"]["devices"]["results"][0]["pool"] = "node-b"; },
      "this node's pool is \"node-a\"");
  add("other-driver",
      [](R j) { j["status"]["allocation"]["devices"]["results"][0]["driver"] = "gpu.nvidia.com"; },
      "has no devices allocated by driver gpumemd.io");
  add("admin", [](R j) { j["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = true; },
      "adminAccess");
  add("missing", nullptr, "NOT_FOUND");
  api_->RemoveClaim("team-a", "missing");
  const ClaimRef good = AddClaim("good", {{"mem", dev, "1Gi"}});
  std::vector<ClaimRef> all = refs;
  all.push_back(good);
  absl::StatusOr<drapb::NodePrepareResourcesResponse> r = kubelet_.Prepare(all);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->claims().size(), all.size());  // every claim answered
  for (size_t i = 0; i < refs.size(); ++i) {
    ASSERT_EQ(r->claims().count(refs[i].uid), 1u) << refs[i].name;
    const std::string& err = r->claims().at(refs[i].uid).error();
    EXPECT_TRUE(absl::StrContains(err, expects[i])) << refs[i].name << ": " << err;
    EXPECT_TRUE(absl::StrContains(err, "team-a/" + refs[i].name)) << refs[i].name << ": " << err;
    ExpectNothingMadeFor(refs[i]);
  }
  EXPECT_EQ(r->claims().at(good.uid).error(), "");
  absl::StatusOr<std::unique_ptr<v1::TenantStats>> t = peer_->Tenant("claim-" + good.uid);
  ASSERT_TRUE(t.ok() && *t != nullptr);
  // Claim references the kubelet could not have sent: refused before any I/O.
  for (const ClaimRef& hostile : {ClaimRef{"team-a", "x", "../../etc"},
                                  ClaimRef{"team-a/../x", "x", "0badc0de-0000-4000-8000-000000000001"},
                                  ClaimRef{"team-a", "", "0badc0de-0000-4000-8000-000000000002"}}) {
    r = kubelet_.Prepare({hostile});
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(absl::StartsWith(r->claims().at(hostile.uid).error(), "INVALID_ARGUMENT"))
        << r->claims().at(hostile.uid).error();
  }
}

TEST_F(DraPluginTest, ApiServerDownOrSlowIsAnErrorInTime) {
  StartPlugin();  // --api_timeout=1s
  const ClaimRef c = AddClaim("late", {{"mem", DeviceName(0), "1Gi"}});
  api_->Down();
  absl::Time start = absl::Now();
  absl::StatusOr<drapb::NodePrepareResourcesResponse> r = kubelet_.Prepare({c});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  std::string err = r->claims().at(c.uid).error();
  EXPECT_TRUE(absl::StartsWith(err, "UNAVAILABLE")) << err;
  EXPECT_TRUE(absl::StrContains(err, "cannot reach the API server")) << err;
  ExpectNothingMadeFor(c);

  api_->Up();
  api_->SetDelay(absl::Seconds(5));
  start = absl::Now();
  r = kubelet_.Prepare({c});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  err = r->claims().at(c.uid).error();
  EXPECT_TRUE(absl::StartsWith(err, "DEADLINE_EXCEEDED")) << err;
  EXPECT_TRUE(absl::StrContains(err, "did not answer within 1s")) << err;
  ExpectNothingMadeFor(c);

  // Back to normal: the kubelet's retry succeeds.
  api_->SetDelay(absl::ZeroDuration());
  r = kubelet_.Prepare({c});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->claims().at(c.uid).error(), "");
}

TEST_F(DraPluginTest, SliceWriteIsRetriedWithBackoff) {
  // --backoff_initial=100ms, --backoff_max=800ms: refused writes are
  // retried after about 100, 200, 400, 800, 800 ms. The property is the
  // lower bound (never sooner than the backoff); the upper bound only says
  // the retries keep coming, with a margin that holds under TSan on two
  // loaded cores (a retry of the 800 ms step took 2.4 s there).
  api_->FailNextSliceWrites(6, 503);
  StartPlugin();
  ASSERT_TRUE(api_->WaitFor(
      [&] {
        for (const auto& w : api_->SliceWrites()) {
          if (w.status == 200) return true;
        }
        return false;
      },
      absl::Seconds(30)))
      << PluginLog();
  const std::vector<FakeApiServer::Request> w = api_->SliceWrites();
  ASSERT_GE(w.size(), 7u);
  const double want_ms[] = {100, 200, 400, 800, 800, 800};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(w[i].status, 503);
    const double gap = absl::ToDoubleMilliseconds(w[i + 1].at - w[i].at);
    EXPECT_GE(gap, want_ms[i] * 0.95) << "retry " << i + 1;
    EXPECT_LE(gap, want_ms[i] * 1.5 + 2000) << "retry " << i + 1;
  }
  EXPECT_EQ(w[6].status, 200);
  EXPECT_TRUE(absl::StrContains(PluginLog(), "HTTP 503")) << PluginLog();

  // The API server gone altogether, then back: the next change arrives.
  api_->Down();
  ASSERT_TRUE(peer_->HoldOutsideClaims(0, kGiB).ok());
  absl::SleepFor(absl::Milliseconds(600));
  api_->Up();
  ASSERT_TRUE(api_->WaitFor(
      [&] {
        const auto writes = api_->SliceWrites();
        return !writes.empty() && writes.back().status == 200 &&
               json::parse(writes.back().body)["spec"]["devices"][0]["capacity"]["memory"]["value"] ==
                   "3Gi";
      },
      absl::Seconds(10)))
      << PluginLog();
}

TEST_F(DraPluginTest, TenantSocketOutsideTheClaimsDirectoryIsRefused) {
  FakeGpumemd* fake = peer_->fake();
  if (fake == nullptr) GTEST_SKIP() << "needs the double (a misbehaving gpumemd)";
  StartPlugin();
  fake->AnswerSocketPath(dir_ + "/elsewhere/claim.sock");
  const ClaimRef c = AddClaim("outside", {{"mem", DeviceName(0), "1Gi"}});
  absl::StatusOr<drapb::NodePrepareResourcesResponse> r = kubelet_.Prepare({c});
  ASSERT_TRUE(r.ok());
  const std::string& err = r->claims().at(c.uid).error();
  EXPECT_TRUE(absl::StartsWith(err, "FAILED_PRECONDITION")) << err;
  EXPECT_TRUE(absl::StrContains(err, "outside the claims directory")) << err;
  ExpectNothingMadeFor(c);
  // The tenant it made was removed again.
  const std::vector<FakeGpumemd::Call> calls = fake->Calls();
  ASSERT_GE(calls.size(), 2u);
  EXPECT_EQ(calls.back().method, "DeleteTenant");
  // A path inside the directory but not the one asked for: refused too.
  fake->AnswerSocketPath(peer_->claims_dir() + "/claim-other/gpumemd.sock");
  r = kubelet_.Prepare({c});
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(absl::StrContains(r->claims().at(c.uid).error(), "not at")) << r->claims().at(c.uid).error();
  ExpectNothingMadeFor(c);
}

TEST_F(DraPluginTest, GpumemdDownIsAnErrorAndLeavesNothing) {
  FakeGpumemd* fake = peer_->fake();
  if (fake == nullptr) GTEST_SKIP() << "stops the double";
  StartPlugin();
  const ClaimRef c = AddClaim("nodaemon", {{"mem", DeviceName(0), "1Gi"}});
  const std::string name0 = DeviceName(0);
  peer_.reset();  // gpumemd gone
  absl::StatusOr<drapb::NodePrepareResourcesResponse> r = kubelet_.Prepare({c});
  ASSERT_TRUE(r.ok());
  const std::string& err = r->claims().at(c.uid).error();
  EXPECT_TRUE(absl::StartsWith(err, "UNAVAILABLE")) << err;
  EXPECT_TRUE(absl::StrContains(err, "gpumemd GetStats")) << err;
  const nlohmann::json state = StateFile();
  EXPECT_FALSE(state.contains("claims") && state["claims"].contains(c.uid));
}

}  // namespace
}  // namespace testing
}  // namespace dra
}  // namespace gpumem
