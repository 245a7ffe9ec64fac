// Prefill / extend attention throughput on the first CUDA device: causal, 32 query / 8 KV heads,
// head_dim 128, bf16, block 16 with shuffled physical blocks (the shapes).
//   prefill_attention_cuda_bench [--only=NAME]
//       (--only: the shapes whose name contains NAME, e.g. --only="8 x 2k", for a profiler)
// TFLOP/s counts 4 * head_dim * num_q_heads * (sum over query rows of visible keys): QK^T and
// P.V, 2 FLOP per multiply-add, causal work only (masked-out keys are not counted). Each shape
// runs the Hopper wgmma kernel and the mma.sync kernel and prints max |wgmma - mma| over the
// output as a cross-check, then over an fp8 e4m3 pool of the same layout (--kv_cache_dtype=fp8:
// codes of other random values, one scale per tensor) the mma.sync kernel reading the codes and
// the wgmma kernel after the widening pass (its time included; max |widened - codes| printed as
// the fp8 cross-check). Prints a table; no pass/fail.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/cuda_status.h"
#include "kernels/attention/cuda/paged_prefill_cuda.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int64_t kHq = 32, kHkv = 8, kD = 128, kBlock = 16;

struct Shape {
  const char* name;
  int64_t num_seqs;
  int64_t q_len;   // new tokens per request
  int64_t prefix;  // cached tokens before them
};

std::vector<uint16_t> RandomBf16(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint16_t> out(n);
  for (uint16_t& x : out) {
    const float f = dist(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    x = static_cast<uint16_t>((bits + 0x8000u) >> 16);
  }
  return out;
}

float Bf16ToFloat(uint16_t x) {
  const uint32_t bits = uint32_t{x} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Fills `bytes` of device memory from one random 64 MiB host chunk, replicated on the device.
absl::Status FillReplicated(void* dst, int64_t bytes, const void* chunk, int64_t chunk_bytes) {
  auto* base = static_cast<uint8_t*>(dst);
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(base, chunk, std::min(chunk_bytes, bytes), cudaMemcpyHostToDevice));
  for (int64_t off = chunk_bytes; off < bytes; off += chunk_bytes) {
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(base + off, base, std::min(chunk_bytes, bytes - off), cudaMemcpyDeviceToDevice));
  }
  return absl::OkStatus();
}

struct Pools {
  void* bf16 = nullptr;
  void* fp8 = nullptr;            // the same layout in e4m3 codes
  const float* scales = nullptr;  // [2]: K, V (device)
  int64_t blocks = 0;
};

absl::Status RunShape(const Shape& shape, int num_sms, const Pools& pools, std::mt19937& rng) {
  void* pool = pools.bf16;
  const int64_t pool_blocks = pools.blocks;
  const int64_t seq_len = shape.prefix + shape.q_len;
  const int64_t tokens = shape.num_seqs * shape.q_len;
  const int64_t blocks_per_seq = (seq_len + kBlock - 1) / kBlock;
  if (shape.num_seqs * blocks_per_seq > pool_blocks) return absl::InternalError("pool too small");
  std::vector<int32_t> perm(pool_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> tables(perm.begin(), perm.begin() + shape.num_seqs * blocks_per_seq);
  std::vector<int32_t> qsl(shape.num_seqs + 1), lens(shape.num_seqs, seq_len);
  for (int64_t i = 0; i <= shape.num_seqs; ++i) qsl[i] = static_cast<int32_t>(i * shape.q_len);

  int32_t *d_tables, *d_qsl, *d_lens;
  __nv_bfloat16 *d_q, *d_out[4];
  float* d_lse;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&d_tables, tables.size() * 4));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&d_qsl, qsl.size() * 4));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&d_lens, lens.size() * 4));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&d_q, tokens * kHq * kD * 2));
  for (auto*& out : d_out) CUDA_RETURN_IF_ERROR(cudaMalloc(&out, tokens * kHq * kD * 2));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&d_lse, tokens * kHq * 4));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(d_tables, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(d_qsl, qsl.data(), qsl.size() * 4, cudaMemcpyHostToDevice));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(d_lens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
  const std::vector<uint16_t> q = RandomBf16(rng, tokens * kHq * kD);
  CUDA_RETURN_IF_ERROR(cudaMemcpy(d_q, q.data(), q.size() * 2, cudaMemcpyHostToDevice));

  // Causal work: row j of a request sees prefix + j + 1 keys.
  const double visible = static_cast<double>(shape.num_seqs) *
                         (static_cast<double>(shape.q_len) * (shape.prefix + 1) +
                          static_cast<double>(shape.q_len) * (shape.q_len - 1) / 2);
  const double flops = 4.0 * kD * kHq * visible;
  const DeviceKvCache cache{.data = pool,
                            .layout = {.num_blocks = pool_blocks,
                                       .num_layers = 1,
                                       .block_size = kBlock,
                                       .num_kv_heads = kHkv,
                                       .head_dim = kD},
                            .dtype = KvDtype::kBf16};
  const AttentionBatch batch{.query_start_loc = d_qsl,
                             .seq_lens = d_lens,
                             .block_tables = d_tables,
                             .num_seqs = shape.num_seqs,
                             .max_blocks_per_seq = blocks_per_seq};
  const AttentionParams params{.scale = 0.0884f};
  DeviceKvCache cache8 = cache;
  cache8.data = pools.fp8;
  cache8.dtype = KvDtype::kFp8E4m3;
  cache8.k_scale = pools.scales;
  cache8.v_scale = pools.scales + 1;
  double us[4] = {0, 0, 0, 0};
  int grid[4] = {0, 0, 0, 0};
  const int64_t kv_blocks = shape.num_seqs * ((seq_len + kBlock - 1) / kBlock);
  void* workspace = nullptr;
  auto plan_for = [&](KvDtype kv, bool wgmma) {
    return PlanPagedPrefill({.num_seqs = shape.num_seqs,
                             .num_tokens = tokens,
                             .max_q_len = shape.q_len,
                             .max_seq_len = seq_len,
                             .num_q_heads = kHq,
                             .num_kv_heads = kHkv,
                             .head_dim = kD,
                             .kv_dtype = kv,
                             .num_sms = num_sms,
                             .allow_wgmma = wgmma,
                             .kv_block_size = kBlock,
                             .total_kv_blocks = kv_blocks,
                             .fp8_widen_max_bytes = int64_t{1} << 30});
  };
  // wgmma, mma.sync, mma.sync over the fp8 codes, wgmma over the widened fp8 pool
  for (int k = 0; k < 4; ++k) {
    const bool fp8 = k >= 2;
    ASSIGN_OR_RETURN(const PagedPrefillPlan plan,
                     plan_for(fp8 ? KvDtype::kFp8E4m3 : KvDtype::kBf16, k == 0 || k == 3));
    if (k == 3 && !plan.widen_fp8) return absl::InternalError("the fp8 plan did not widen");
    if (plan.workspace_bytes > 0) {
      CUDA_RETURN_IF_ERROR(cudaMalloc(&workspace, plan.workspace_bytes));
    }
    grid[k] = plan.grid;
    auto run = [&] {
      return PagedPrefillAttention<__nv_bfloat16>(d_q, fp8 ? cache8 : cache, 0, batch, params, plan,
                                                  d_out[k], d_lse, workspace, nullptr);
    };
    for (int i = 0; i < 2; ++i) RETURN_IF_ERROR(run());
    CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    cudaEvent_t start, stop;
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
    // ~100 ms of work at 400 TFLOP/s (the mma.sync kernel takes longer).
    const int iters = static_cast<int>(std::clamp(0.1 / (flops / 400e12), 3.0, 200.0));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(start));
    for (int i = 0; i < iters; ++i) RETURN_IF_ERROR(run());
    CUDA_RETURN_IF_ERROR(cudaEventRecord(stop));
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
    us[k] = ms * 1e3 / iters;
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    if (workspace != nullptr) cudaFree(workspace);
    workspace = nullptr;
  }
  std::vector<uint16_t> o[4];
  for (int k = 0; k < 4; ++k) {
    o[k].resize(tokens * kHq * kD);
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(o[k].data(), d_out[k], o[k].size() * 2, cudaMemcpyDeviceToHost));
  }
  // max |a - b| and max |b| over the outputs of runs a, b (NaN: infinite).
  auto diff = [&](int a, int b, double* max_abs) {
    double max_diff = 0;
    for (size_t i = 0; i < o[a].size(); ++i) {
      const double x = Bf16ToFloat(o[a][i]), y = Bf16ToFloat(o[b][i]);
      max_diff = std::max(max_diff, std::isnan(x) || std::isnan(y) ? INFINITY : std::abs(x - y));
      *max_abs = std::max(*max_abs, std::abs(y));
    }
    return max_diff;
  };
  double max_abs = 0, max_abs8 = 0;
  const double max_diff = diff(0, 1, &max_abs), max_diff8 = diff(3, 2, &max_abs8);
  std::printf(
      "%-22s %10.1f %9.1f %5d %10.1f %9.1f %5d %12.2e %9.3f %10.1f %9.1f %5d %10.1f %9.1f %12.2e\n",
      shape.name, us[0], flops / us[0] * 1e-6, grid[0], us[1], flops / us[1] * 1e-6, grid[1],
      max_diff, max_abs, us[2], flops / us[2] * 1e-6, grid[2], us[3], flops / us[3] * 1e-6,
      max_diff8 / std::max(1e-30, max_abs8));
  cudaFree(d_tables);
  cudaFree(d_qsl);
  cudaFree(d_lens);
  cudaFree(d_q);
  for (void* out : d_out) cudaFree(out);
  cudaFree(d_lse);
  return absl::OkStatus();
}

absl::Status Run(const char* only) {
  cudaDeviceProp prop{};
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  std::printf(
      "device: %s, %d SMs; causal prefill, 32 q / 8 kv heads, d128, bf16, block 16 shuffled\n"
      "TFLOP/s = 4 * head_dim * num_q_heads * sum over query rows of visible keys / time\n",
      prop.name, prop.multiProcessorCount);
  // One pool for every shape: 1 GiB of random bf16 (a 64 MiB chunk replicated on the device).
  const int64_t block_bytes = 2 * kBlock * kHkv * kD * 2;
  Pools pools;
  pools.blocks = (int64_t{1} << 30) / block_bytes;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&pools.bf16, pools.blocks * block_bytes));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&pools.fp8, pools.blocks * block_bytes / 2));
  float* scales = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&scales, 2 * sizeof(float)));
  const float host_scales[2] = {1.0f / 64, 1.0f / 64};
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(scales, host_scales, sizeof(host_scales), cudaMemcpyHostToDevice));
  pools.scales = scales;
  std::mt19937 rng(7);
  {
    const int64_t chunk = int64_t{64} << 20;
    const std::vector<uint16_t> host = RandomBf16(rng, chunk / 2);
    RETURN_IF_ERROR(FillReplicated(pools.bf16, pools.blocks * block_bytes, host.data(), chunk));
    std::vector<__nv_fp8_e4m3> codes(chunk);  // values * 64, so x = code / 64
    for (int64_t i = 0; i < chunk; ++i) codes[i] = __nv_fp8_e4m3(64.0f * Bf16ToFloat(host[i / 2]));
    RETURN_IF_ERROR(FillReplicated(pools.fp8, pools.blocks * block_bytes / 2, codes.data(), chunk));
  }
  std::printf("%-22s %10s %9s %5s %10s %9s %5s %12s %9s %10s %9s %5s %10s %9s %12s\n", "shape",
              "wgmma_us", "TFLOP/s", "grid", "mma_us", "TFLOP/s", "grid", "max|diff|", "max|out|",
              "fp8_mma_us", "TFLOP/s", "grid", "fp8_wg_us", "TFLOP/s", "fp8_rel_diff");
  const Shape shapes[] = {
      {"1 x 1k prefill", 1, 1024, 0},           {"1 x 4k prefill", 1, 4096, 0},
      {"1 x 16k prefill", 1, 16384, 0},         {"8 x 2k prefill", 8, 2048, 0},
      {"2k new over 8k prefix", 1, 2048, 8192},
  };
  for (const Shape& shape : shapes) {
    if (std::strstr(shape.name, only) == nullptr) continue;
    RETURN_IF_ERROR(RunShape(shape, prop.multiProcessorCount, pools, rng));
  }
  CUDA_RETURN_IF_ERROR(cudaFree(pools.bf16));
  CUDA_RETURN_IF_ERROR(cudaFree(pools.fp8));
  CUDA_RETURN_IF_ERROR(cudaFree(scales));
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::kernels::cuda

int main(int argc, char** argv) {
  const char* only = "";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--only=", 7) == 0) only = argv[i] + 7;
  }
  const absl::Status status = tandem::kernels::cuda::Run(only);
  if (!status.ok()) {
    std::fprintf(stderr, "prefill_attention_cuda_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
