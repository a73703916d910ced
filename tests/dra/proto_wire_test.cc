// Pins the wire names of proto/k8s/ to the Kubernetes API definitions they
// were written from: k8s.io/kubelet pkg/apis/pluginregistration/v1/api.proto
// and pkg/apis/dra/{v1,v1beta1}/api.proto, as of tags v0.34.0 and v0.34.9
// (Kubernetes 1.34; the files are identical between the two). A kubelet
// finds the services by full name and decodes fields by number, so a change
// here breaks the plugin on a real node even though every other test passes.
#include <string>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>

#include "gtest/gtest.h"
#include "proto/k8s/dra/v1/api.pb.h"
#include "proto/k8s/dra/v1beta1/api.pb.h"
#include "proto/k8s/pluginregistration/v1/api.pb.h"

namespace {

using google::protobuf::Descriptor;
using google::protobuf::DescriptorPool;
using google::protobuf::FieldDescriptor;

// Referencing the generated code links it in (a static link, as under
// --config=tsan, drops object files nothing refers to, and with them their
// descriptors' registration in the generated pool).
const bool kLinked = pluginregistration::PluginInfo::descriptor() != nullptr &&
                     k8s::io::kubelet::pkg::apis::dra::v1::Claim::descriptor() != nullptr &&
                     k8s::io::kubelet::pkg::apis::dra::v1beta1::Claim::descriptor() != nullptr;

struct Field {
  const char* name;
  int number;
  FieldDescriptor::Type type;
  bool repeated;
};

void ExpectMessage(const std::string& full_name, const std::vector<Field>& fields) {
  ASSERT_TRUE(kLinked);
  const Descriptor* d = DescriptorPool::generated_pool()->FindMessageTypeByName(full_name);
  ASSERT_NE(d, nullptr) << full_name;
  EXPECT_EQ(d->field_count(), static_cast<int>(fields.size())) << full_name;
  for (const Field& f : fields) {
    const FieldDescriptor* fd = d->FindFieldByName(f.name);
    ASSERT_NE(fd, nullptr) << full_name << "." << f.name;
    EXPECT_EQ(fd->number(), f.number) << full_name << "." << f.name;
    EXPECT_EQ(fd->type(), f.type) << full_name << "." << f.name;
    EXPECT_EQ(fd->is_repeated(), f.repeated) << full_name << "." << f.name;
  }
}

constexpr auto kString = FieldDescriptor::TYPE_STRING;
constexpr auto kBool = FieldDescriptor::TYPE_BOOL;
constexpr auto kMessage = FieldDescriptor::TYPE_MESSAGE;

TEST(ProtoWireTest, PluginRegistrationV1) {
  const auto* s = DescriptorPool::generated_pool()->FindServiceByName("pluginregistration.Registration");
  ASSERT_NE(s, nullptr);
  ASSERT_NE(s->FindMethodByName("GetInfo"), nullptr);
  EXPECT_EQ(s->FindMethodByName("GetInfo")->input_type()->full_name(), "pluginregistration.InfoRequest");
  EXPECT_EQ(s->FindMethodByName("GetInfo")->output_type()->full_name(), "pluginregistration.PluginInfo");
  ASSERT_NE(s->FindMethodByName("NotifyRegistrationStatus"), nullptr);
  EXPECT_EQ(s->FindMethodByName("NotifyRegistrationStatus")->input_type()->full_name(),
            "pluginregistration.RegistrationStatus");
  ExpectMessage("pluginregistration.PluginInfo", {{"type", 1, kString, false},
                                                  {"name", 2, kString, false},
                                                  {"endpoint", 3, kString, false},
                                                  {"supported_versions", 4, kString, true}});
  ExpectMessage("pluginregistration.RegistrationStatus",
                {{"plugin_registered", 1, kBool, false}, {"error", 2, kString, false}});
  ExpectMessage("pluginregistration.RegistrationStatusResponse", {});
  ExpectMessage("pluginregistration.InfoRequest", {});
}

class DraWireTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DraWireTest, NodeService) {
  const std::string p = "k8s.io.kubelet.pkg.apis.dra." + GetParam() + ".";
  const auto* s = DescriptorPool::generated_pool()->FindServiceByName(p + "DRAPlugin");
  ASSERT_NE(s, nullptr) << p;
  ASSERT_EQ(s->method_count(), 2);
  EXPECT_EQ(s->FindMethodByName("NodePrepareResources")->input_type()->full_name(),
            p + "NodePrepareResourcesRequest");
  EXPECT_EQ(s->FindMethodByName("NodePrepareResources")->output_type()->full_name(),
            p + "NodePrepareResourcesResponse");
  EXPECT_EQ(s->FindMethodByName("NodeUnprepareResources")->input_type()->full_name(),
            p + "NodeUnprepareResourcesRequest");
  ExpectMessage(p + "NodePrepareResourcesRequest", {{"claims", 1, kMessage, true}});
  ExpectMessage(p + "NodePrepareResourcesResponse", {{"claims", 1, kMessage, true}});  // a map
  ExpectMessage(p + "NodePrepareResourceResponse",
                {{"devices", 1, kMessage, true}, {"error", 2, kString, false}});
  ExpectMessage(p + "Device", {{"request_names", 1, kString, true},
                               {"pool_name", 2, kString, false},
                               {"device_name", 3, kString, false},
                               {"cdi_device_ids", 4, kString, true}});
  ExpectMessage(p + "NodeUnprepareResourcesRequest", {{"claims", 1, kMessage, true}});
  ExpectMessage(p + "NodeUnprepareResourcesResponse", {{"claims", 1, kMessage, true}});
  ExpectMessage(p + "NodeUnprepareResourceResponse", {{"error", 1, kString, false}});
  ExpectMessage(p + "Claim", {{"namespace", 1, kString, false},
                              {"uid", 2, kString, false},
                              {"name", 3, kString, false}});
  const Descriptor* map = DescriptorPool::generated_pool()
                              ->FindMessageTypeByName(p + "NodePrepareResourcesResponse")
                              ->FindFieldByName("claims")
                              ->message_type();
  EXPECT_TRUE(map->options().map_entry());
  EXPECT_EQ(map->FindFieldByName("key")->type(), kString);
  EXPECT_EQ(map->FindFieldByName("value")->message_type()->full_name(),
            p + "NodePrepareResourceResponse");
}

INSTANTIATE_TEST_SUITE_P(Versions, DraWireTest, ::testing::Values("v1", "v1beta1"));

}  // namespace
