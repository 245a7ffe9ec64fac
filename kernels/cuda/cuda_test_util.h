// Test helpers for the CUDA kernels (testonly): owned device buffers and host-side bf16/fp16
// rounding, so references can be computed on exactly the values the kernels see.
#ifndef TANDEM_KERNELS_CUDA_CUDA_TEST_UTIL_H_
#define TANDEM_KERNELS_CUDA_CUDA_TEST_UTIL_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::kernels::cuda_test {

#define TANDEM_CUDA_CHECK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

// A fresh seed per test (std::random_device), or TANDEM_TEST_SEED to replay one; printed and
// recorded as a test property so a failure names it.
inline uint32_t TestSeed() {
  uint32_t seed = std::random_device{}();
  if (const char* env = std::getenv("TANDEM_TEST_SEED"); env != nullptr && *env != '\0') {
    seed = static_cast<uint32_t>(std::strtoul(env, nullptr, 10));
  }
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  std::cout << "seed=" << seed << " (replay with TANDEM_TEST_SEED=" << seed << ")\n";
  return seed;
}

// Owned device allocation of n elements of T (cudaMalloc: 256-byte aligned).
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n > 0 && cudaMalloc(reinterpret_cast<void**>(&ptr_), n * sizeof(T)) != cudaSuccess)
      ptr_ = nullptr;
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    if (ptr_ != nullptr) {
      cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), n_(o.n_) { o.ptr_ = nullptr; }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  std::vector<T> ToHost() const {
    std::vector<T> host(n_);
    if (n_ > 0) cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

template <typename T>
inline T FromF(float x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(x);
  } else if constexpr (std::is_same_v<T, __nv_fp8_e4m3>) {
    return __nv_fp8_e4m3(x);
  } else {
    return x;
  }
}
template <typename T>
inline float ToF(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(x);
  } else if constexpr (std::is_same_v<T, __half>) {
    return __half2float(x);
  } else {
    return static_cast<float>(x);
  }
}

template <typename T>
std::vector<T> Convert(const std::vector<float>& x) {
  std::vector<T> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = FromF<T>(x[i]);
  return out;
}
template <typename T>
std::vector<float> ToFloat(const std::vector<T>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = ToF(x[i]);
  return out;
}
// Rounds every element to T and back, in place.
template <typename T>
void RoundTo(std::vector<float>& x) {
  for (float& e : x) e = ToF(FromF<T>(e));
}

}  // namespace tandem::kernels::cuda_test

#endif  // TANDEM_KERNELS_CUDA_CUDA_TEST_UTIL_H_
