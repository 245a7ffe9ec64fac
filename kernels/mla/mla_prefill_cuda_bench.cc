// MLA prefill on the first CUDA device, absorbed (MlaAbsorbedAttention) vs unabsorbed
// (MlaUnabsorbedAttention), DeepSeek widths (nope 128, rope 64, latent 512, v 128), bf16, page 64:
// one request of `chunk` new tokens over a paged prefix of `prefix` latents (seq_len = prefix +
// chunk), by heads x prefix x chunk.
//   mla_prefill_cuda_bench [--heads=16,128] [--prefixes=0,1024,4096,16384] [--chunks=512,2048]
//                          [--iters=10]
// Each form: the whole step (absorbed: W_UK GEMM, latent kernel, W_UV GEMM; unabsorbed: gather,
// up-projection GEMMs, prefill kernel at head_dim 192 with V 128), mean of --iters calls between
// CUDA events after 2 warm-ups, alternating the two forms' timing blocks. TFLOP/s is in one unit
// for both: 2 x Hq x (Dn + Dr + Dv) flops per visible (query, key) pair (the unabsorbed form's
// attention math) over the step's time. Prints a table; no pass/fail.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/mla/mla_cuda.h"
#include "kernels/mla/mla_test_util.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int64_t kBlock = 64;

// Device memory freed at scope exit.
struct Mem {
  void* p = nullptr;
  ~Mem() { cudaFree(p); }
  absl::Status Alloc(int64_t bytes) {
    CUDA_RETURN_IF_ERROR(cudaMalloc(&p, std::max<int64_t>(bytes, 256)));
    return absl::OkStatus();
  }
};

absl::StatusOr<double> TimeUs(int iters, cudaStream_t stream,
                              const std::function<absl::Status()>& call) {
  for (int i = 0; i < 2; ++i) RETURN_IF_ERROR(call());
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0, stream);
  for (int i = 0; i < iters; ++i) RETURN_IF_ERROR(call());
  cudaEventRecord(e1, stream);
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(e1));
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms * 1e3 / iters;
}

absl::Status RunConfig(cublasHandle_t cublas, int64_t heads, int64_t prefix, int64_t chunk,
                       int iters, int num_sms, cudaStream_t stream) {
  MlaDims dims = mla_test::kV3Dims;
  dims.num_heads = heads;
  const int64_t ctx = prefix + chunk, blocks = (ctx + kBlock - 1) / kBlock;
  const KvCacheLayout layout{.num_blocks = blocks,
                             .num_layers = 1,
                             .block_size = kBlock,
                             .num_kv_heads = 1,
                             .head_dim = dims.LatentDim(),
                             .num_planes = 1};
  std::vector<int32_t> table(blocks), qsl = {0, static_cast<int32_t>(chunk)};
  std::vector<int32_t> lens = {static_cast<int32_t>(ctx)};
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(7));
  Mem pool, q, kv_b, out, lse, meta, abs_ws, un_ws;
  RETURN_IF_ERROR(pool.Alloc(layout.TotalElems() * 2));
  RETURN_IF_ERROR(FillRandomBf16(pool.p, layout.TotalElems() * 2));
  RETURN_IF_ERROR(q.Alloc(chunk * heads * 192 * 2));
  RETURN_IF_ERROR(FillRandomBf16(q.p, chunk * heads * 192 * 2));
  RETURN_IF_ERROR(kv_b.Alloc(heads * 256 * 512 * 2));
  RETURN_IF_ERROR(FillRandomBf16(kv_b.p, heads * 256 * 512 * 2));
  RETURN_IF_ERROR(out.Alloc(chunk * heads * 128 * 2));
  RETURN_IF_ERROR(lse.Alloc(chunk * heads * 4));
  RETURN_IF_ERROR(meta.Alloc((blocks + 3) * 4));
  auto* m = static_cast<int32_t*>(meta.p);
  CUDA_RETURN_IF_ERROR(cudaMemcpy(m, qsl.data(), 8, cudaMemcpyDefault));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(m + 2, lens.data(), 4, cudaMemcpyDefault));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(m + 3, table.data(), blocks * 4, cudaMemcpyDefault));
  const AttentionBatch batch{.query_start_loc = m,
                             .seq_lens = m + 2,
                             .block_tables = m + 3,
                             .num_seqs = 1,
                             .max_blocks_per_seq = blocks};
  const DeviceKvCache cache{.data = pool.p, .layout = layout, .dtype = KvDtype::kBf16};
  const MlaPlanInput in{.dims = dims,
                        .num_seqs = 1,
                        .num_tokens = chunk,
                        .max_q_len = chunk,
                        .max_seq_len = ctx,
                        .num_sms = num_sms};
  ASSIGN_OR_RETURN(const MlaPlan abs_plan, PlanMla(in));
  ASSIGN_OR_RETURN(const MlaUnabsorbedPlan un_plan, PlanMlaUnabsorbed(in, ctx));
  RETURN_IF_ERROR(abs_ws.Alloc(abs_plan.workspace_bytes));
  RETURN_IF_ERROR(un_ws.Alloc(un_plan.workspace_bytes));
  const float scale = 1.0f / std::sqrt(192.0f);
  using B = __nv_bfloat16;
  auto absorbed = [&] {
    return MlaAbsorbedAttention<B>(cublas, static_cast<B*>(q.p), static_cast<B*>(kv_b.p), cache, 0,
                                   batch, scale, abs_plan, abs_ws.p, static_cast<B*>(out.p),
                                   static_cast<float*>(lse.p), stream);
  };
  auto unabsorbed = [&] {
    return MlaUnabsorbedAttention<B>(cublas, static_cast<B*>(q.p), static_cast<B*>(kv_b.p), cache,
                                     0, batch, scale, un_plan, un_ws.p, static_cast<B*>(out.p),
                                     static_cast<float*>(lse.p), stream);
  };
  // Two alternating rounds per form; the best round's mean.
  double abs_us = 1e30, un_us = 1e30;
  for (int round = 0; round < 2; ++round) {
    ASSIGN_OR_RETURN(const double a, TimeUs(iters, stream, absorbed));
    ASSIGN_OR_RETURN(const double u, TimeUs(iters, stream, unabsorbed));
    abs_us = std::min(abs_us, a);
    un_us = std::min(un_us, u);
  }
  const double pairs = double(chunk) * prefix + double(chunk) * (chunk + 1) / 2;
  const double flops = pairs * heads * 2 * (192 + 128);
  std::printf("| %3ld | %6ld | %5ld | %9.1f | %9.1f | %5.2f | %s | %5.0f | %5.0f |\n",
              static_cast<long>(heads), static_cast<long>(prefix), static_cast<long>(chunk), abs_us,
              un_us, un_us / abs_us, un_us < abs_us ? "unabsorbed" : "absorbed",
              flops / abs_us / 1e6, flops / un_us / 1e6);
  std::fflush(stdout);
  return absl::OkStatus();
}

absl::Status Main(int argc, char** argv) {
  const char* heads_arg = nullptr;
  const char* prefixes_arg = nullptr;
  const char* chunks_arg = nullptr;
  int iters = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--heads=", 0) == 0) heads_arg = argv[i] + 8;
    if (a.rfind("--prefixes=", 0) == 0) prefixes_arg = argv[i] + 11;
    if (a.rfind("--chunks=", 0) == 0) chunks_arg = argv[i] + 9;
    if (a.rfind("--iters=", 0) == 0) iters = std::max(1, std::atoi(argv[i] + 8));
  }
  cublasHandle_t cublas = nullptr;
  if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) return absl::InternalError("cublas");
  cudaStream_t stream;
  CUDA_RETURN_IF_ERROR(cudaStreamCreate(&stream));
  cudaDeviceProp prop;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  std::printf("MLA prefill, %s: nope 128 + rope 64, latent 512, v 128, bf16, page %ld, 1 request\n",
              prop.name, static_cast<long>(kBlock));
  std::printf(
      "| heads | prefix | chunk | absorbed us | unabsorbed us | un/abs | faster | abs TFLOP/s | "
      "unabs TFLOP/s |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (int64_t h : mla_test::ParseInt64List(heads_arg, {16, 128})) {
    for (int64_t c : mla_test::ParseInt64List(chunks_arg, {512, 2048})) {
      for (int64_t p : mla_test::ParseInt64List(prefixes_arg, {0, 1024, 4096, 16384})) {
        RETURN_IF_ERROR(RunConfig(cublas, h, p, c, iters, prop.multiProcessorCount, stream));
      }
    }
  }
  cublasDestroy(cublas);
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::kernels::cuda

int main(int argc, char** argv) {
  const absl::Status s = tandem::kernels::cuda::Main(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "mla_prefill_cuda_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
