// FillRandomBf16: benchmark data on the device, bf16 N(0, 1) values from a fixed seed (the same
// bytes every run): a 64 MiB chunk made on the host and replicated by device copies
// (FillReplicated, for data of other formats made on the host).
#ifndef TANDEM_KERNELS_CUDA_RANDOM_FILL_H_
#define TANDEM_KERNELS_CUDA_RANDOM_FILL_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "common/cuda_status.h"

namespace tandem::kernels::cuda {

// Fills `bytes` of device memory at `data` with the `chunk` host bytes at `host`, repeated.
inline absl::Status FillReplicated(void* data, int64_t bytes, const void* host, int64_t chunk) {
  chunk = std::min(chunk, bytes);
  auto* base = static_cast<uint8_t*>(data);
  CUDA_RETURN_IF_ERROR(cudaMemcpy(base, host, chunk, cudaMemcpyHostToDevice));
  for (int64_t off = chunk; off < bytes; off += chunk) {
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(base + off, base, std::min(chunk, bytes - off), cudaMemcpyDeviceToDevice));
  }
  return absl::OkStatus();
}

// Fills `bytes` (even) of device memory at `data`; bf16 by truncating the float's low half.
inline absl::Status FillRandomBf16(void* data, int64_t bytes) {
  const int64_t chunk = std::min<int64_t>(bytes, int64_t{64} << 20);
  std::vector<uint16_t> host(chunk / 2);
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (uint16_t& x : host) {
    const float f = dist(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    x = static_cast<uint16_t>(bits >> 16);
  }
  return FillReplicated(data, bytes, host.data(), chunk);
}

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_CUDA_RANDOM_FILL_H_
