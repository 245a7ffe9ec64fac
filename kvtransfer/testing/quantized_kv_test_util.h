// Quantized KV blocks for transfer tests: a KV pool of fp8 e4m3 / int8 values plus a separate
// fp32 scale region, filled deterministically from a seed so two processes (the agent_peer
// source and the checking reader) produce the same bytes without exchanging them.
//
// Layout (block-major, ARCHITECTURE.md "KV cache"; scales travel with the block):
//   values: [num_blocks][num_layers][2][block_size][num_kv_heads][head_dim]  1 byte each
//   scales: [num_blocks][num_layers][2][block_size][num_kv_heads]            fp32, one per token
//                                                                             per head
// A "row" is one (layer, K/V, token, head): head_dim values sharing one scale. Row r of a block
// is the r-th row in that order. Value = decode(code) * scale.
//
// Besides quantized random numbers every block carries special bit patterns that a transfer
// must not touch: fp8 NaN (0x7F, 0xFF), -0 (0x80), +-max (0x7E, 0xFE), the smallest subnormal
// (0x01); int8 -128, 127, -1, 0; and scales +-inf, NaN with payloads (quiet and signalling),
// -0 and the smallest fp32 denormal. Row 0 of every block holds every special value code and
// rows 1 and 2 special scales (row 1 a NaN), so each block has them; more are sprinkled
// pseudo-randomly.
//
// Thread safety: all functions are pure.
#ifndef TANDEM_KVTRANSFER_QUANTIZED_KV_TEST_UTIL_H_
#define TANDEM_KVTRANSFER_QUANTIZED_KV_TEST_UTIL_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tandem::kvtransfer::testing {

enum class KvQuant { kFp8E4m3, kInt8 };

struct QuantizedKvShape {
  KvQuant quant = KvQuant::kFp8E4m3;
  int num_layers = 2;
  int block_size = 16;
  int num_kv_heads = 2;
  int head_dim = 64;

  uint64_t RowsPerBlock() const { return uint64_t{2} * num_layers * block_size * num_kv_heads; }
  uint64_t ValueBlockBytes() const { return RowsPerBlock() * head_dim; }
  uint64_t ScaleBlockBytes() const { return RowsPerBlock() * sizeof(float); }
};

// "fp8" / "int8" plus "L,B,H,D" (layers, block size, kv heads, head dim) -> shape.
// INVALID_ARGUMENT naming the bad part.
absl::StatusOr<QuantizedKvShape> ParseQuantizedKvShape(absl::string_view quant,
                                                       absl::string_view dims);

// The unquantized value of element d of row `row` of block `block` (what the quantizer saw).
double QuantizedKvOriginal(uint64_t seed, uint64_t block, uint64_t row, int d);

// The special bits stored as row `row`'s scale instead of the real one, if any.
std::optional<uint32_t> SpecialScaleBits(uint64_t seed, uint64_t block, uint64_t row);

// The special code planted at element d of row `row`, if any (replaces the quantized value).
std::optional<uint8_t> PlantedValueCode(const QuantizedKvShape& shape, uint64_t seed,
                                        uint64_t block, uint64_t row, int d);

// fp8 e4m3fn encoding, round to nearest even, saturating at +-448 (NaN in -> 0x7F).
uint8_t EncodeFp8E4m3(double x);

// Fills block `block` of the value and scale regions.
// REQUIRES: values.size() == shape.ValueBlockBytes(), scales.size() == shape.ScaleBlockBytes().
void FillQuantizedKvBlock(const QuantizedKvShape& shape, uint64_t seed, uint64_t block,
                          absl::Span<uint8_t> values, absl::Span<uint8_t> scales);

}  // namespace tandem::kvtransfer::testing

#endif  // TANDEM_KVTRANSFER_QUANTIZED_KV_TEST_UTIL_H_
