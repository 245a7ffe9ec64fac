// GPU test helpers (testonly, CUDA builds only).
//
//   TEST(MyKernelTest, Matches) { TANDEM_SKIP_WITHOUT_GPU(); ... }
//
// Without a usable CUDA device the test is skipped (GTEST_SKIP) with the reason, so CI machines
// without GPUs count it as skipped. Set TANDEM_REQUIRE_GPU=1 (tests/gpu/run.sh does) to turn
// the skip into a failure: on a GPU machine a broken driver must not pass silently.
#ifndef TANDEM_COMMON_GPU_TEST_UTIL_H_
#define TANDEM_COMMON_GPU_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "gtest/gtest.h"

namespace tandem::testing {

// True when at least one CUDA device can be used; otherwise `why` says what is missing.
inline bool GpuAvailable(std::string* why) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    *why = std::string("no usable CUDA device: ") + cudaGetErrorName(err) + " (" +
           cudaGetErrorString(err) + ")";
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  if (count == 0) {
    *why = "no CUDA device present";
    return false;
  }
  return true;
}

inline bool GpuRequired() {
  const char* v = std::getenv("TANDEM_REQUIRE_GPU");
  return v != nullptr && std::strcmp(v, "0") != 0 && v[0] != '\0';
}

}  // namespace tandem::testing

#define TANDEM_SKIP_WITHOUT_GPU()                                      \
  do {                                                                 \
    std::string tandem_gpu_why_;                                       \
    if (!::tandem::testing::GpuAvailable(&tandem_gpu_why_)) {          \
      if (::tandem::testing::GpuRequired()) {                          \
        FAIL() << "TANDEM_REQUIRE_GPU is set but " << tandem_gpu_why_; \
      }                                                                \
      GTEST_SKIP() << tandem_gpu_why_;                                 \
    }                                                                  \
  } while (false)

#endif  // TANDEM_COMMON_GPU_TEST_UTIL_H_
