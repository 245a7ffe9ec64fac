// Quantized KV between two real processes over UcxAgent on loopback: an agent_peer child holds
// an fp8 e4m3 or int8 KV pool plus a separate fp32 scale region ([blocks][layers][2]
// [block_size][kv_heads], registered as the second region); random block lists move both
// regions' ranges of the same blocks, and the reader checks every byte (NaN/inf bit patterns
// in values and scales included) plus the dequantized values against an fp64 reference.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvtransfer/testing/agent_test_util.h"
#include "kvtransfer/testing/peer_process.h"
#include "kvtransfer/testing/quantized_kv_test_util.h"
#include "kvtransfer/ucx/ucx_agent.h"
#include "kvtransfer/ucx/ucx_two_process_test_util.h"

namespace tandem::kvtransfer {
namespace {

using ::tandem::v1::MEMORY_KIND_HOST;
using testing::BlockPairs;
using testing::QuantizedKvShape;

constexpr uint8_t kFill = 0xA7;

// (quantization "fp8"/"int8", pools from AllocateMemory (shared-memory direct copies) or the
// heap (GETs over the monitor endpoint)).
class UcxQuantizedKvTest : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(UcxQuantizedKvTest, RandomBlockListsWithScalesAreBitExact) {
  const auto& [quant, allocate] = GetParam();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  // Odd sizes for int8, so ranges are not all powers of two.
  const std::string dims = quant == "fp8" ? "4,16,4,128" : "3,16,2,96";
  absl::StatusOr<QuantizedKvShape> shape = testing::ParseQuantizedKvShape(quant, dims);
  ASSERT_TRUE(shape.ok()) << shape.status();
  const uint32_t remote_blocks = 96, local_blocks = 64;
  std::unique_ptr<PeerProcess> peer = testing::StartAgentPeer(
      SiblingBinary("agent_peer"),
      {absl::StrCat("--kv_quant=", quant), absl::StrCat("--kv_shape=", dims),
       absl::StrCat("--kv_blocks=", remote_blocks), absl::StrCat("--seed=", seed),
       absl::StrCat("--allocate=", allocate ? "true" : "false")});
  ASSERT_NE(peer, nullptr);
  ASSERT_EQ(peer->descriptor().regions_size(), 2);

  // Small requests, so value blocks split across requests and scale ranges share a window.
  auto agent = UcxAgent::Create({.max_request_bytes = 100000, .max_inflight_bytes = 1 << 20});
  ASSERT_TRUE(agent.ok()) << agent.status();
  std::unique_ptr<UcxAgent> reader = *std::move(agent);
  const uint64_t values_bytes = local_blocks * shape->ValueBlockBytes();
  const uint64_t scales_bytes = local_blocks * shape->ScaleBlockBytes();
  std::vector<uint8_t> heap_values, heap_scales;
  uint8_t* values = nullptr;
  uint8_t* scales = nullptr;
  if (allocate) {
    auto v = reader->AllocateMemory(values_bytes, MEMORY_KIND_HOST);
    auto s = reader->AllocateMemory(scales_bytes, MEMORY_KIND_HOST);
    ASSERT_TRUE(v.ok() && s.ok());
    values = static_cast<uint8_t*>(v->first);
    scales = static_cast<uint8_t*>(s->first);
  } else {
    heap_values.resize(values_bytes);
    heap_scales.resize(scales_bytes);
    values = heap_values.data();
    scales = heap_scales.data();
    ASSERT_TRUE(reader->RegisterMemory(values, values_bytes, MEMORY_KIND_HOST).ok());
    ASSERT_TRUE(reader->RegisterMemory(scales, scales_bytes, MEMORY_KIND_HOST).ok());
  }
  ASSERT_TRUE(reader->AddPeer("p", peer->descriptor()).ok());

  for (int round = 0; round < 6; ++round) {
    std::fill_n(values, values_bytes, kFill);
    std::fill_n(scales, scales_bytes, kFill);
    const BlockPairs pairs =
        testing::RandomBlockPairs(rng, remote_blocks, local_blocks, 1 + rng() % 48);
    const std::vector<CopyOp> ops = testing::QuantizedBlockOps(*shape, pairs);
    absl::StatusOr<TransferId> id = reader->PostRead("p", ops);
    ASSERT_TRUE(id.ok()) << id.status();
    ASSERT_TRUE(testing::WaitForEnd(*reader, *id).ok());
    testing::ExpectQuantizedBlocks(*shape, seed, absl::MakeConstSpan(values, values_bytes),
                                   absl::MakeConstSpan(scales, scales_bytes), pairs, kFill);
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(reader->Stats().transfers_completed, 6u);
  reader.reset();
  EXPECT_EQ(peer->Stop(), 0);
}

INSTANTIATE_TEST_SUITE_P(QuantAndMemory, UcxQuantizedKvTest,
                         ::testing::Combine(::testing::Values("fp8", "int8"), ::testing::Bool()),
                         [](const auto& info) {
                           return absl::StrCat(std::get<0>(info.param),
                                               std::get<1>(info.param) ? "_allocated" : "_heap");
                         });

// The generator itself: encoder round trip on every fp8 code, and the planted patterns.
TEST(QuantizedKvTestUtil, Fp8EncoderRoundTripsEveryFiniteCode) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    const double x = testing::DecodeFp8E4m3(code);
    if (std::isnan(x)) {
      EXPECT_EQ(testing::EncodeFp8E4m3(x) & 0x7F, 0x7F);
      continue;
    }
    if (code == 0x80) continue;  // -0 encodes as -0: same bits, checked below
    EXPECT_EQ(testing::EncodeFp8E4m3(x), code) << "code " << c << " value " << x;
  }
  EXPECT_EQ(testing::EncodeFp8E4m3(-0.0), 0x80);
  EXPECT_EQ(testing::EncodeFp8E4m3(1e9), 0x7E);  // saturates
  EXPECT_EQ(testing::EncodeFp8E4m3(-1e9), 0xFE);
  EXPECT_EQ(testing::EncodeFp8E4m3(1.0 + 1.0 / 16), 0x38);  // tie 1.0 / 1.125 -> even (1.0)
  EXPECT_FALSE(testing::ParseQuantizedKvShape("fp4", "1,1,1,1").ok());
  EXPECT_FALSE(testing::ParseQuantizedKvShape("fp8", "1,1,1").ok());
}

}  // namespace
}  // namespace tandem::kvtransfer
