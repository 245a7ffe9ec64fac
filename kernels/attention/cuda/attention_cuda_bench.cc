// Decode attention bandwidth on the first CUDA device: batch x context table for 32 query / 8
// KV heads, head_dim 128, block 16 (the shapes), bf16 KV (plus a few fp8 and int8 rows).
//   attention_cuda_bench [--only=DTYPE:BATCHxCONTEXT[@SPLITS],... [--splits=N]] [--flush_l2]
//       [--legacy_split_merge] [--separate_merge] [--pool_gib=N] [--cluster_merge=0,1,...]
//       [--pdl=1] [--plan_keys=N]
//       (e.g. --only=fp8_e4m3:64x16384: that one tensor-core config, for a profiler; --splits
//       or @SPLITS forces the planner's KV split count; --flush_l2 times the way FlashInfer's peer
//       script does, for tests/gpu/attention_vs_flashinfer.sh: each call alone between CUDA events
//       after a 256 MiB memset that evicts the L2, median of >= 20 calls; --legacy_split_merge:
//       the split planner and merge from before issue 35, for a same-call baseline;
//       --separate_merge: the splits merged by the PDL-launched merge kernel instead of inside the
//       decode kernel (the workspace is zeroed once, so the in-kernel merge is the default);
//       --pool_gib caps the KV pool, default 64, whose fill takes ~20 s: configs that do not fit
//       are skipped; --cluster_merge: a list of merge modes, each config timed once per entry in
//       the order given (e.g. 0,1,0,1): 1 = PagedAttentionPlanInput::cluster_merge (the splits
//       merged through a thread-block cluster; rows print "cluster", or the planner's reason for
//       falling back), 0 = the merge the other flags choose; --pdl=1: the calls PDL-launched
//       (programmatic_launch), back to back; --plan_keys=N: the plan's max_seq_len (default: the
//       context; the runtime's graphs plan for max_model_len, >= 8192 in decode_step_bench);
//       --only takes any BATCHxCONTEXT)
// GB/s counts KV bytes read (int8: + its fp32 per-token scales, 4 bytes per K or V row) + q + o
// (+ lse) bytes over the measured time; "%peak" is against 4.3 TB/s (H200 device copy). Small
// configs read from a rotating set of block tables over a pool >= 1 GiB, so repeated calls do not
// run out of the 60 MB L2. Prints a table; no pass/fail.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/cuda_status.h"
#include "kernels/attention/cuda/paged_attention_cuda.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int64_t kHq = 32, kHkv = 8, kD = 128, kBlock = 16;
constexpr double kPeak = 4.3e12;
constexpr int64_t kFlushBytes = int64_t{256} << 20;

struct Pool {
  void* data = nullptr;
  int64_t num_blocks = 0;
  float* token_scales = nullptr;  // for the int8 view (twice num_blocks 1-byte blocks)
};

// One pool for every config: max KV bytes, or 1 GiB, whichever is larger; filled with random
// bf16 values (a 64 MiB random chunk replicated on the device).
absl::Status MakePool(int64_t bytes, Pool* pool) {
  const int64_t block_bytes = 2 * kBlock * kHkv * kD * 2;
  pool->num_blocks = (bytes + block_bytes - 1) / block_bytes;
  const int64_t total = pool->num_blocks * block_bytes;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&pool->data, total));
  const int64_t chunk = int64_t{64} << 20;
  std::vector<uint16_t> host(chunk / 2);
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (uint16_t& x : host) {
    const float f = dist(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    x = static_cast<uint16_t>(bits >> 16);
  }
  auto* base = static_cast<uint8_t*>(pool->data);
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(base, host.data(), std::min(chunk, total), cudaMemcpyHostToDevice));
  for (int64_t off = chunk; off < total; off += chunk) {
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(base + off, base, std::min(chunk, total - off), cudaMemcpyDeviceToDevice));
  }
  // int8 scales: 2 x num_blocks blocks of 2 x 16 x 8 rows, all 0.02.
  const int64_t scales = 2 * pool->num_blocks * 2 * kBlock * kHkv;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&pool->token_scales, scales * 4));
  const std::vector<float> fill(std::min<int64_t>(scales, chunk / 4), 0.02f);
  for (int64_t off = 0; off < scales; off += static_cast<int64_t>(fill.size())) {
    CUDA_RETURN_IF_ERROR(cudaMemcpy(pool->token_scales + off, fill.data(),
                                    std::min<int64_t>(fill.size(), scales - off) * 4,
                                    cudaMemcpyHostToDevice));
  }
  return absl::OkStatus();
}

// Seconds per call of `run`: back-to-back calls over ~20 ms of KV reads, or (flush != null)
// the median of single calls, each after a memset of the kFlushBytes `flush` buffer.
template <typename Run>
absl::StatusOr<double> TimeCalls(const Run& run, double kv_bytes, void* flush) {
  cudaEvent_t start, stop;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  double sec = 0;
  if (flush == nullptr) {
    const int iters = static_cast<int>(std::clamp(20e-3 / (kv_bytes / kPeak), 5.0, 2000.0));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(start));
    for (int i = 0; i < iters; ++i) RETURN_IF_ERROR(run(i));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(stop));
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
    sec = ms * 1e-3 / iters;
  } else {
    const int iters = static_cast<int>(std::clamp(50e-3 / (kv_bytes / kPeak), 20.0, 200.0));
    std::vector<double> times(iters);
    for (int i = 0; i < iters; ++i) {
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flush, i & 0xff, kFlushBytes));
      CUDA_RETURN_IF_ERROR(cudaEventRecord(start));
      RETURN_IF_ERROR(run(i));
      CUDA_RETURN_IF_ERROR(cudaEventRecord(stop));
      CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
      float ms = 0;
      CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
      times[i] = ms * 1e-3;
    }
    std::nth_element(times.begin(), times.begin() + iters / 2, times.end());
    sec = times[iters / 2];
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return sec;
}

// Options of one bench run.
struct BenchOptions {
  const char* only = nullptr;
  int64_t forced_splits = 0;
  bool flush_l2 = false;
  bool legacy_split_merge = false;
  bool separate_merge = false;
  int64_t pool_gib = 64;
  std::vector<int> cluster_modes = {0};
  bool pdl = false;
  int64_t plan_keys = 0;
};

// Per-run plan options beyond the split count and merge.
struct RunExtras {
  bool cluster_merge = false;
  bool pdl = false;
  int64_t plan_keys = 0;  // > 0: the plan's max_seq_len
};

absl::Status RunConfig(const Pool& pool, int num_sms, int64_t batch, int64_t ctx, KvDtype dtype,
                       bool tensor_cores, std::mt19937& rng, int64_t forced_splits = 0,
                       void* flush = nullptr, bool legacy = false, bool separate = false,
                       const RunExtras& extras = {}) {
  const int64_t kv_elem = KvDtypeBytes(dtype);
  const int64_t blocks_per_seq = (ctx + kBlock - 1) / kBlock;
  // The pool holds bf16-sized blocks; an fp8 view of it has twice as many.
  const int64_t pool_blocks = pool.num_blocks * (2 / kv_elem);
  const int64_t needed = batch * blocks_per_seq;
  if (needed > pool_blocks) {
    std::printf("%6lld %7lld skipped (pool too small)\n", static_cast<long long>(batch),
                static_cast<long long>(ctx));
    return absl::OkStatus();
  }
  const int64_t sets = std::max<int64_t>(1, std::min<int64_t>(8, pool_blocks / needed));
  std::vector<int32_t> perm(pool_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> tables(sets * needed);
  for (int64_t i = 0; i < sets * needed; ++i) tables[i] = perm[i];
  std::vector<int32_t> qsl(batch + 1), lens(batch, static_cast<int32_t>(ctx));
  for (int64_t i = 0; i <= batch; ++i) qsl[i] = static_cast<int32_t>(i);

  int32_t *d_tables, *d_qsl, *d_lens;
  void *d_q, *d_out, *d_ws = nullptr;
  float *d_lse, *d_scale;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&d_tables, tables.size() * 4));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&d_qsl, qsl.size() * 4));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&d_lens, lens.size() * 4));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&d_q, batch * kHq * kD * 2));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&d_out, batch * kHq * kD * 2));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&d_lse, batch * kHq * 4));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&d_scale, kHkv * 4));
  const std::vector<float> scales(kHkv, 0.05f);
  CUDA_RETURN_IF_ERROR(cudaMemcpy(d_scale, scales.data(), kHkv * 4, cudaMemcpyHostToDevice));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(d_tables, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(d_qsl, qsl.data(), qsl.size() * 4, cudaMemcpyHostToDevice));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(d_lens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(d_q, pool.data, batch * kHq * kD * 2, cudaMemcpyDeviceToDevice));

  PagedAttentionPlanInput in{.num_seqs = batch,
                             .num_tokens = batch,
                             .max_q_len = 1,
                             .max_seq_len = extras.plan_keys > 0 ? extras.plan_keys : ctx,
                             .num_q_heads = kHq,
                             .num_kv_heads = kHkv,
                             .head_dim = kD,
                             .kv_dtype = dtype,
                             .num_sms = num_sms,
                             .forced_splits = static_cast<int>(forced_splits),
                             .allow_tensor_cores = tensor_cores,
                             .legacy_split_merge = legacy,
                             .workspace_zeroed = !separate,
                             .programmatic_launch = extras.pdl,
                             .cluster_merge = extras.cluster_merge};
  ASSIGN_OR_RETURN(const PagedAttentionPlan plan, PlanPagedAttention(in));
  if (plan.workspace_bytes > 0) {
    CUDA_RETURN_IF_ERROR(cudaMalloc(&d_ws, plan.workspace_bytes));
    CUDA_RETURN_IF_ERROR(cudaMemset(d_ws, 0, plan.workspace_bytes));
  }
  DeviceKvCache cache{.data = pool.data,
                      .layout = {.num_blocks = pool_blocks,
                                 .num_layers = 1,
                                 .block_size = kBlock,
                                 .num_kv_heads = kHkv,
                                 .head_dim = kD},
                      .dtype = dtype,
                      .k_scale = d_scale,
                      .v_scale = d_scale,
                      .per_head_scale = true,
                      .token_scales = pool.token_scales};
  const AttentionParams params{.scale = 0.0884f};
  auto run = [&](int64_t i) {
    AttentionBatch b{.query_start_loc = d_qsl,
                     .seq_lens = d_lens,
                     .block_tables = d_tables + (i % sets) * needed,
                     .num_seqs = batch,
                     .max_blocks_per_seq = blocks_per_seq};
    return PagedAttention<__nv_bfloat16>(static_cast<const __nv_bfloat16*>(d_q), cache, 0, b,
                                         params, plan, static_cast<__nv_bfloat16*>(d_out), d_lse,
                                         d_ws, nullptr);
  };
  for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(run(i));
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  const int64_t row_bytes = kD * kv_elem + (dtype == KvDtype::kInt8 ? 4 : 0);
  const double kv_bytes = static_cast<double>(batch) * ctx * kHkv * 2 * row_bytes;
  const double io_bytes = static_cast<double>(batch) * kHq * (kD * 2 * 2 + 4);
  ASSIGN_OR_RETURN(const double sec, TimeCalls(run, kv_bytes, flush));
  const double gbs = (kv_bytes + io_bytes) / sec / 1e9;
  std::printf("%6lld %7lld %8s %4s %7d %10.1f %9.1f %8.1f %7.1f%%%s%s%s\n",
              static_cast<long long>(batch), static_cast<long long>(ctx), KvDtypeName(dtype),
              plan.use_tensor_cores ? "mma" : "fma", plan.num_splits, sec * 1e6, kv_bytes / 1e6,
              gbs, 100.0 * gbs * 1e9 / kPeak, plan.cluster_merge ? " cluster" : "",
              extras.cluster_merge && !plan.cluster_merge ? " no cluster: " : "",
              extras.cluster_merge && !plan.cluster_merge ? plan.cluster_merge_fallback : "");
  cudaFree(d_tables);
  cudaFree(d_qsl);
  cudaFree(d_lens);
  cudaFree(d_q);
  cudaFree(d_out);
  cudaFree(d_lse);
  cudaFree(d_scale);
  if (d_ws != nullptr) cudaFree(d_ws);
  return absl::OkStatus();
}

absl::Status Run(const BenchOptions& opt) {
  const char* only = opt.only;
  const bool legacy = opt.legacy_split_merge, separate = opt.separate_merge;
  cudaDeviceProp prop{};
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs; decode, 32 q / 8 kv heads, d128, block 16, q_len 1\n", prop.name,
              prop.multiProcessorCount);
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  const int64_t want = int64_t{256} * 65536 * kHkv * kD * 2 * 2;  // 68.7 GB: 256 x 64k bf16
  const int64_t pool_bytes = std::min<int64_t>(
      {want, static_cast<int64_t>(free_bytes) - (int64_t{8} << 30), opt.pool_gib << 30});
  Pool pool;
  RETURN_IF_ERROR(MakePool(pool_bytes, &pool));
  void* flush = nullptr;
  if (opt.flush_l2) CUDA_RETURN_IF_ERROR(cudaMalloc(&flush, kFlushBytes));
  std::printf("split planner and merge: %s\n", legacy     ? "legacy (before issue 35)"
                                               : separate ? "current planner, PDL merge kernel"
                                                          : "current planner, in-kernel merge");
  std::printf("timing: %s\n", opt.flush_l2
                                  ? "median of single calls, L2 flushed (256 MiB) before each"
                                  : "mean of back-to-back calls");
  std::printf("%6s %7s %8s %4s %7s %10s %9s %8s %8s\n", "batch", "context", "kv", "core", "splits",
              "time_us", "KV_MB", "GB/s", "%4.3TB/s");
  std::mt19937 rng(7);
  if (only != nullptr) {
    // A comma-separated list; "@N" after a config forces N splits for it.
    for (absl::string_view item : absl::StrSplit(only, ',')) {
      const size_t at = item.find('@');
      int64_t splits = opt.forced_splits;
      if (at != absl::string_view::npos) {
        splits = std::atoll(std::string(item.substr(at + 1)).c_str());
        item = item.substr(0, at);
      }
      const size_t colon = item.find(':'), x = item.find('x');
      if (colon == absl::string_view::npos || x == absl::string_view::npos || x < colon) {
        return absl::InvalidArgumentError(absl::StrCat("--only: bad config ", item));
      }
      const int64_t batch = std::atoll(std::string(item.substr(colon + 1, x - colon - 1)).c_str());
      const int64_t ctx = std::atoll(std::string(item.substr(x + 1)).c_str());
      for (KvDtype dtype : {KvDtype::kBf16, KvDtype::kFp8E4m3, KvDtype::kInt8}) {
        if (item.substr(0, colon) != KvDtypeName(dtype) || batch <= 0 || ctx <= 0) continue;
        for (int mode : opt.cluster_modes) {
          RETURN_IF_ERROR(RunConfig(pool, prop.multiProcessorCount, batch, ctx, dtype, true, rng,
                                    splits, flush, legacy, separate,
                                    {mode != 0, opt.pdl, opt.plan_keys}));
        }
      }
    }
    return absl::OkStatus();
  }
  for (int64_t batch : {1, 16, 64, 256}) {
    for (int64_t ctx : {1024, 4096, 16384, 65536}) {
      for (int mode : opt.cluster_modes) {
        RETURN_IF_ERROR(RunConfig(pool, prop.multiProcessorCount, batch, ctx, KvDtype::kBf16, true,
                                  rng, 0, flush, legacy, separate,
                                  {mode != 0, opt.pdl, opt.plan_keys}));
      }
    }
  }
  for (KvDtype dtype : {KvDtype::kFp8E4m3, KvDtype::kInt8}) {
    for (auto [batch, ctx] : std::vector<std::pair<int64_t, int64_t>>{
             {1, 65536}, {16, 16384}, {64, 4096}, {64, 16384}, {256, 4096}}) {
      RETURN_IF_ERROR(RunConfig(pool, prop.multiProcessorCount, batch, ctx, dtype, true, rng, 0,
                                flush, legacy, separate));
    }
  }
  std::printf("CUDA-core (fma) kernel on the same bf16 shapes, for comparison:\n");
  for (auto [batch, ctx] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 65536}, {16, 16384}, {64, 4096}, {64, 16384}, {256, 4096}}) {
    RETURN_IF_ERROR(RunConfig(pool, prop.multiProcessorCount, batch, ctx, KvDtype::kBf16, false,
                              rng, 0, flush, legacy, separate));
  }
  RETURN_IF_ERROR(RunConfig(pool, prop.multiProcessorCount, 64, 16384, KvDtype::kFp8E4m3, false,
                            rng, 0, flush, legacy, separate));
  RETURN_IF_ERROR(RunConfig(pool, prop.multiProcessorCount, 64, 16384, KvDtype::kInt8, false, rng,
                            0, flush, legacy, separate));
  CUDA_RETURN_IF_ERROR(cudaFree(pool.data));
  CUDA_RETURN_IF_ERROR(cudaFree(pool.token_scales));
  if (flush != nullptr) CUDA_RETURN_IF_ERROR(cudaFree(flush));
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::kernels::cuda

int main(int argc, char** argv) {
  tandem::kernels::cuda::BenchOptions opt;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--only=", 7) == 0) {
      opt.only = argv[i] + 7;
    } else if (std::strncmp(argv[i], "--splits=", 9) == 0) {
      opt.forced_splits = std::atoll(argv[i] + 9);
    } else if (std::strcmp(argv[i], "--flush_l2") == 0) {
      opt.flush_l2 = true;
    } else if (std::strcmp(argv[i], "--legacy_split_merge") == 0) {
      opt.legacy_split_merge = true;
    } else if (std::strcmp(argv[i], "--separate_merge") == 0) {
      opt.separate_merge = true;
    } else if (std::strncmp(argv[i], "--pool_gib=", 11) == 0) {
      opt.pool_gib = std::max<int64_t>(1, std::atoll(argv[i] + 11));
    } else if (std::strncmp(argv[i], "--cluster_merge=", 16) == 0) {
      opt.cluster_modes.clear();
      for (absl::string_view m : absl::StrSplit(argv[i] + 16, ',')) {
        opt.cluster_modes.push_back(std::atoi(std::string(m).c_str()));
      }
    } else if (std::strncmp(argv[i], "--pdl=", 6) == 0) {
      opt.pdl = std::atoi(argv[i] + 6) != 0;
    } else if (std::strncmp(argv[i], "--plan_keys=", 12) == 0) {
      opt.plan_keys = std::atoll(argv[i] + 12);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--only=DTYPE:BATCHxCONTEXT[@SPLITS],... [--splits=N]] [--flush_l2] "
                   "[--legacy_split_merge] [--separate_merge] [--pool_gib=N] "
                   "[--cluster_merge=0,1,...] [--pdl=1] [--plan_keys=N]\n",
                   argv[0]);
      return 2;
    }
  }
  const absl::Status status = tandem::kernels::cuda::Run(opt);
  if (!status.ok()) {
    std::fprintf(stderr, "attention_cuda_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
