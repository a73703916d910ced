// Kubernetes quantities as byte counts: the grammar, exact rounding up of
// fractional bytes, and the refusals (negative, too big, not a quantity).
#include "client/dra/quantity.h"

#include "gtest/gtest.h"

namespace gpumem {
namespace dra {
namespace {

uint64_t Q(const char* s) {
  absl::StatusOr<uint64_t> v = ParseQuantityBytes(s);
  EXPECT_TRUE(v.ok()) << s << ": " << v.status();
  return v.value_or(~uint64_t{0});
}

TEST(QuantityTest, Parses) {
  EXPECT_EQ(Q("0"), 0u);
  EXPECT_EQ(Q("8589934592"), uint64_t{8} << 30);
  EXPECT_EQ(Q("8Gi"), uint64_t{8} << 30);
  EXPECT_EQ(Q("+8Gi"), uint64_t{8} << 30);
  EXPECT_EQ(Q("1536Mi"), uint64_t{1536} << 20);
  EXPECT_EQ(Q("1.5Gi"), uint64_t{1536} << 20);
  EXPECT_EQ(Q("1Ki"), 1024u);
  EXPECT_EQ(Q("1Ei"), uint64_t{1} << 60);
  EXPECT_EQ(Q("15Ei"), uint64_t{15} << 60);
  EXPECT_EQ(Q("1k"), 1000u);
  EXPECT_EQ(Q("1500M"), 1500000000u);
  EXPECT_EQ(Q("8G"), 8000000000u);
  EXPECT_EQ(Q("2T"), 2000000000000u);
  EXPECT_EQ(Q("1E"), 1000000000000000000u);  // E alone is exa, not an exponent
  EXPECT_EQ(Q("1e3"), 1000u);
  EXPECT_EQ(Q("1E3"), 1000u);
  EXPECT_EQ(Q("12e+2"), 1200u);
  EXPECT_EQ(Q("0.5"), 1u);       // rounded up, as Quantity.Value()
  EXPECT_EQ(Q("1500m"), 2u);     // 1.5 bytes
  EXPECT_EQ(Q("2000m"), 2u);
  EXPECT_EQ(Q("1n"), 1u);
  EXPECT_EQ(Q("5e-1"), 1u);
  EXPECT_EQ(Q("1e-100"), 1u);
  EXPECT_EQ(Q("0.1Ki"), 103u);   // 102.4
  EXPECT_EQ(Q(".5Ki"), 512u);
  EXPECT_EQ(Q("5."), 5u);
  EXPECT_EQ(Q("0.000000000000000000000000000001Ei"), 1u);
  EXPECT_EQ(Q("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(Q("0Ei"), 0u);
}

TEST(QuantityTest, Refuses) {
  for (const char* bad : {"", "Gi", "abc", "1.2.3", "1Gb", "1gi", "1 Gi", "1GiB", "-1", "-1Gi",
                          "18446744073709551616", "16Ei", "1e20", "1e", "1e+", "1e1000", "0x10",
                          "1Zi", "1Mi ", " 1Mi", "1111111111111111111111111111111"}) {
    absl::StatusOr<uint64_t> v = ParseQuantityBytes(bad);
    EXPECT_FALSE(v.ok()) << "\"" << bad << "\" parsed as " << *v;
    if (!v.ok()) {
      EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(v.status().message().find("is not a byte quantity"), absl::string_view::npos);
    }
  }
}

TEST(QuantityTest, FormatsCanonically) {
  EXPECT_EQ(FormatQuantityBytes(0), "0");
  EXPECT_EQ(FormatQuantityBytes(1000), "1000");
  EXPECT_EQ(FormatQuantityBytes(1024), "1Ki");
  EXPECT_EQ(FormatQuantityBytes(uint64_t{1536} << 20), "1536Mi");
  EXPECT_EQ(FormatQuantityBytes(uint64_t{80} << 30), "80Gi");
  EXPECT_EQ(FormatQuantityBytes(uint64_t{1} << 60), "1Ei");
  EXPECT_EQ(FormatQuantityBytes(UINT64_MAX), "18446744073709551615");
  for (uint64_t v : {uint64_t{1}, uint64_t{4096}, uint64_t{3} << 40, (uint64_t{1} << 62) + 1024}) {
    EXPECT_EQ(Q(FormatQuantityBytes(v).c_str()), v);
  }
}

}  // namespace
}  // namespace dra
}  // namespace gpumem
