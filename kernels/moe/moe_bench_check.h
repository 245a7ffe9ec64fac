// Exit-on-error checks for the MoE benchmark binaries (moe_cuda_bench, moe_fp8_cuda_bench): a
// failed CUDA call or absl::Status prints the expression and exits 1 (a benchmark has nothing to
// recover). Benchmarks only; library code returns absl::Status.
#ifndef TANDEM_KERNELS_MOE_MOE_BENCH_CHECK_H_
#define TANDEM_KERNELS_MOE_MOE_BENCH_CHECK_H_

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"

#define CHECK_CUDA(x)                                                   \
  do {                                                                  \
    if ((x) != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s failed: %d\n", #x, static_cast<int>(x)); \
      std::exit(1);                                                     \
    }                                                                   \
  } while (0)
#define CHECK_OK(x)                                                            \
  do {                                                                         \
    const absl::Status s_ = (x);                                               \
    if (!s_.ok()) {                                                            \
      std::fprintf(stderr, "%s: %s\n", #x, std::string(s_.message()).c_str()); \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

#endif  // TANDEM_KERNELS_MOE_MOE_BENCH_CHECK_H_
