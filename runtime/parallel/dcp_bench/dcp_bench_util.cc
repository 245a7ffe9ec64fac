#include "runtime/parallel/dcp_bench/dcp_bench_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

namespace tandem::runtime::dcp_bench {
namespace {

// Copies `chunk` to `data` and then replicates it on the device up to `bytes`.
absl::Status Replicate(const std::vector<uint16_t>& chunk, void* data, int64_t bytes) {
  const int64_t chunk_bytes = std::min<int64_t>(bytes, chunk.size() * 2);
  auto* base = static_cast<uint8_t*>(data);
  CUDA_RETURN_IF_ERROR(cudaMemcpy(base, chunk.data(), chunk_bytes, cudaMemcpyHostToDevice));
  for (int64_t off = chunk_bytes; off < bytes; off += chunk_bytes) {
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(base + off, base, std::min(chunk_bytes, bytes - off), cudaMemcpyDeviceToDevice));
  }
  return absl::OkStatus();
}

float Bf16BitsToFloat(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, 4);
  return f;
}

}  // namespace

absl::Status FillRandomBf16(void* data, int64_t bytes, float scale) {
  static const std::vector<uint16_t>* const chunk = [] {
    auto* host = new std::vector<uint16_t>(int64_t{32} << 20);  // 64 MiB
    std::mt19937 rng(42);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (uint16_t& x : *host) {
      const float f = dist(rng);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      x = static_cast<uint16_t>(bits >> 16);
      if ((x & 0x7fff) == 0) x = 0x3f80;  // 1.0
    }
    return host;
  }();
  if (scale != 1.0f) {  // a scaled copy of the chunk (rounded to bf16, zeros kept away)
    std::vector<uint16_t> scaled(std::min<int64_t>(bytes / 2, chunk->size()));
    for (size_t i = 0; i < scaled.size(); ++i) {
      uint32_t wide = static_cast<uint32_t>((*chunk)[i]) << 16;
      float f;
      std::memcpy(&f, &wide, 4);
      f *= scale;
      std::memcpy(&wide, &f, 4);
      scaled[i] = static_cast<uint16_t>(wide >> 16);
      if ((scaled[i] & 0x7fff) == 0) scaled[i] = (*chunk)[i];
    }
    return Replicate(scaled, data, bytes);
  }
  return Replicate(*chunk, data, bytes);
}

absl::StatusOr<std::vector<float>> Download(const __nv_bfloat16* device, int64_t count) {
  std::vector<uint16_t> bits(count);
  CUDA_RETURN_IF_ERROR(cudaMemcpy(bits.data(), device, count * 2, cudaMemcpyDeviceToHost));
  std::vector<float> out(count);
  for (int64_t i = 0; i < count; ++i) out[i] = Bf16BitsToFloat(bits[i]);
  return out;
}

double RankSliceRelError(const std::vector<float>& want, const std::vector<float>& got,
                         int64_t batch, int64_t num_heads, int64_t rank, int64_t heads_per_rank,
                         int64_t dim) {
  double err = 0, scale = 0;
  for (int64_t t = 0; t < batch; ++t) {
    for (int64_t h = 0; h < heads_per_rank; ++h) {
      for (int64_t i = 0; i < dim; ++i) {
        const double w = want[(t * num_heads + rank * heads_per_rank + h) * dim + i];
        const double x = got[(t * heads_per_rank + h) * dim + i];
        err = std::isnan(x) ? INFINITY : std::max(err, std::abs(x - w));
        scale = std::max(scale, std::abs(w));
      }
    }
  }
  return scale > 0 ? err / scale : err;
}

}  // namespace tandem::runtime::dcp_bench
