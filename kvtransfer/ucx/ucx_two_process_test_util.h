// Helpers shared by the two-process UcxAgent tests (ucx_quantized_kv_test.cc, ucx_gpu_test.cc):
// starting an agent_peer, random block lists, and the checks of received quantized KV blocks.
// Test-only (gtest assertions), header-only.
#ifndef TANDEM_KVTRANSFER_UCX_TWO_PROCESS_TEST_UTIL_H_
#define TANDEM_KVTRANSFER_UCX_TWO_PROCESS_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "kvtransfer/copy_ops.h"
#include "kvtransfer/testing/peer_process.h"
#include "kvtransfer/testing/quantized_kv_test_util.h"

namespace tandem::kvtransfer::testing {

// Starts `binary args...` (the agent_peer harness); null after a failed EXPECT.
inline std::unique_ptr<PeerProcess> StartAgentPeer(const std::string& binary,
                                                   const std::vector<std::string>& args) {
  auto peer = PeerProcess::Start(binary, args, absl::Seconds(60));
  EXPECT_TRUE(peer.ok()) << peer.status();
  return peer.ok() ? *std::move(peer) : nullptr;
}

// n distinct remote blocks (of remote_blocks) paired with n distinct local blocks (of
// local_blocks), random order; sorted half of the time so runs coalesce.
struct BlockPairs {
  std::vector<uint32_t> remote;
  std::vector<uint32_t> local;
};
inline BlockPairs RandomBlockPairs(std::mt19937& rng, uint32_t remote_blocks, uint32_t local_blocks,
                                   uint32_t n) {
  n = std::min({n, remote_blocks, local_blocks});
  BlockPairs p;
  p.remote.resize(remote_blocks);
  p.local.resize(local_blocks);
  for (uint32_t i = 0; i < remote_blocks; ++i) p.remote[i] = i;
  for (uint32_t i = 0; i < local_blocks; ++i) p.local[i] = i;
  std::shuffle(p.remote.begin(), p.remote.end(), rng);
  std::shuffle(p.local.begin(), p.local.end(), rng);
  p.remote.resize(n);
  p.local.resize(n);
  if (rng() % 2) {
    std::sort(p.remote.begin(), p.remote.end());
    std::sort(p.local.begin(), p.local.end());
  }
  return p;
}

// The ops moving both regions' ranges of the same blocks: values (region 0 -> local region
// `values_region`) and scales (region 1 -> local `values_region + 1`).
inline std::vector<CopyOp> QuantizedBlockOps(const QuantizedKvShape& shape, const BlockPairs& p,
                                             uint32_t values_region = 0) {
  std::vector<CopyOp> ops =
      BlockCopyOps(values_region, 0, shape.ValueBlockBytes(), p.local, p.remote);
  std::vector<CopyOp> scales =
      BlockCopyOps(values_region + 1, 1, shape.ScaleBlockBytes(), p.local, p.remote);
  ops.insert(ops.end(), scales.begin(), scales.end());
  return ops;
}

// fp8 e4m3fn decode, written independently of the encoder under test: NaN for S.1111.111.
inline double DecodeFp8E4m3(uint8_t code) {
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  const int exp = (code >> 3) & 0xF;
  const int mant = code & 7;
  if (exp == 15 && mant == 7) return std::nan("");
  if (exp == 0) return sign * std::ldexp(mant / 8.0, -6);
  return sign * std::ldexp(1.0 + mant / 8.0, exp - 7);
}

// Checks every local block after a transfer of `p` into the local value/scale arrays:
//  * targets are bit-exact copies of the source's blocks (values and scales regenerated from
//    `seed`), special bit patterns included (asserted to be present);
//  * dequantized values (decode(code) * scale, fp64) match the fp64 originals within the
//    quantization error, for rows with a regular scale and unplanted elements;
//  * every other local block still holds `fill` in both arrays.
inline void ExpectQuantizedBlocks(const QuantizedKvShape& shape, uint64_t seed,
                                  absl::Span<const uint8_t> values,
                                  absl::Span<const uint8_t> scales, const BlockPairs& p,
                                  uint8_t fill) {
  const uint64_t vb = shape.ValueBlockBytes();
  const uint64_t sb = shape.ScaleBlockBytes();
  const uint32_t local_blocks = static_cast<uint32_t>(values.size() / vb);
  std::vector<int64_t> source_of(local_blocks, -1);
  for (size_t i = 0; i < p.local.size(); ++i) source_of[p.local[i]] = p.remote[i];
  std::vector<uint8_t> expect_v(vb), expect_s(sb);
  uint64_t nan_values = 0, nan_scales = 0, checked = 0;
  for (uint32_t b = 0; b < local_blocks; ++b) {
    const uint8_t* v = values.data() + b * vb;
    const uint8_t* s = scales.data() + b * sb;
    if (source_of[b] < 0) {
      ASSERT_TRUE(std::all_of(v, v + vb, [&](uint8_t x) { return x == fill; }) &&
                  std::all_of(s, s + sb, [&](uint8_t x) { return x == fill; }))
          << "local block " << b << " was not a target but changed";
      continue;
    }
    const uint64_t src = static_cast<uint64_t>(source_of[b]);
    FillQuantizedKvBlock(shape, seed, src, absl::MakeSpan(expect_v), absl::MakeSpan(expect_s));
    for (uint64_t i = 0; i < vb; ++i) {
      ASSERT_EQ(v[i], expect_v[i])
          << "local block " << b << " (source " << src << ") value byte " << i;
    }
    for (uint64_t i = 0; i < sb; ++i) {
      ASSERT_EQ(s[i], expect_s[i])
          << "local block " << b << " (source " << src << ") scale byte " << i;
    }
    for (uint64_t row = 0; row < shape.RowsPerBlock(); ++row) {
      float scale = 0;
      std::memcpy(&scale, s + row * sizeof(float), sizeof(float));
      nan_scales += std::isnan(scale);
      const bool regular_scale = !SpecialScaleBits(seed, src, row).has_value();
      for (int d = 0; d < shape.head_dim; ++d) {
        const uint8_t code = v[row * shape.head_dim + d];
        if (shape.quant == KvQuant::kFp8E4m3) nan_values += (code & 0x7F) == 0x7F;
        if (!regular_scale || PlantedValueCode(shape, seed, src, row, d).has_value()) continue;
        const double q = shape.quant == KvQuant::kFp8E4m3
                             ? DecodeFp8E4m3(code)
                             : static_cast<double>(static_cast<int8_t>(code));
        const double x = QuantizedKvOriginal(seed, src, row, d);
        // fp8 e4m3: 3 mantissa bits (half-ulp 2^-4 relative), subnormal step 2^-9 (x scale);
        // int8: half a step.
        const double tol = shape.quant == KvQuant::kFp8E4m3
                               ? std::fabs(x) * 0.0625 + std::ldexp(scale, -9) * 1.01
                               : 0.5 * scale * 1.001;
        ASSERT_LE(std::fabs(q * scale - x), tol) << "block " << src << " row " << row << " d " << d
                                                 << ": " << q << " * " << scale << " vs " << x;
        ++checked;
      }
    }
  }
  if (!p.local.empty()) {
    EXPECT_GT(nan_scales, 0u) << "no NaN scale moved: the special patterns are missing";
    if (shape.quant == KvQuant::kFp8E4m3) {
      EXPECT_GT(nan_values, 0u);
    }
    EXPECT_GT(checked, 0u);
  }
}

}  // namespace tandem::kvtransfer::testing

#endif  // TANDEM_KVTRANSFER_UCX_TWO_PROCESS_TEST_UTIL_H_
