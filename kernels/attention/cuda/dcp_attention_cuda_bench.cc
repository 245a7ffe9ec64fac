// Decode context parallelism, one rank's kernels per layer on the first CUDA device: shard
// attention (cuda::PagedAttention over the rank's 1/KVP of the context, global positions), the
// exchange pack, and unpack + N-way merge, at Llama-3-8B shapes (32 q / 8 kv heads, head_dim
// 128, bf16, block 16 = interleave) for KVP 1, 2, 4, 8 at context 32k, batch 1 and 8, with
// TP_A = 1 (each rank attends all 32 heads; the merge owns 32 / KVP). The all-to-all itself needs
// several GPUs and is not timed: the table gives the bytes each rank sends (= receives). The
// merge reads the rank's own send buffer as if received (same sizes, valid data).
//   dcp_attention_cuda_bench
// Times are CUDA-graph replays of many calls (device time, as the engine runs a decode step),
// plus the total launched call by call; "total" runs the three in sequence.
// KV is read from a >= 1 GiB pool through rotating block tables so the 50-60 MB L2 does not hold
// it between calls. Prints a table; no pass/fail.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/attention/cuda/dcp_exchange_cuda.h"
#include "kernels/attention/cuda/paged_attention_cuda.h"
#include "kernels/cuda/device_arena.h"
#include "kernels/cuda/random_fill.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int64_t kHq = 32, kHkv = 8, kD = 128, kBlock = 16, kContext = 32768;
constexpr int64_t kBlockBytes = 2 * kBlock * kHkv * kD * 2;  // K + V of one block, bf16

using StepFn = std::function<absl::Status(int)>;  // enqueues call i on the config's stream

// Microseconds between two events around `launch`.
absl::StatusOr<double> ElapsedUs(cudaStream_t stream, const std::function<absl::Status()>& launch) {
  cudaEvent_t start, stop;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream));
  const absl::Status status = launch();
  CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream));
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
  float ms = 0;
  CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  RETURN_IF_ERROR(status);
  return 1e3 * ms;
}

// Average microseconds per call over `iters` back-to-back calls after 3 warm-up calls: includes
// the host's launch cost wherever that exceeds the kernels' time.
absl::StatusOr<double> EagerUs(const StepFn& fn, int iters, cudaStream_t stream) {
  for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(fn(i));
  ASSIGN_OR_RETURN(const double us, ElapsedUs(stream, [&]() -> absl::Status {
                     for (int i = 0; i < iters; ++i) RETURN_IF_ERROR(fn(i));
                     return absl::OkStatus();
                   }));
  return us / iters;
}

// The same with the `iters` calls captured in one CUDA graph and replayed (as the engine runs a
// decode step): device time without the host's launch cost.
absl::StatusOr<double> GraphUs(const StepFn& fn, int iters, cudaStream_t stream) {
  RETURN_IF_ERROR(fn(0));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  absl::Status captured = absl::OkStatus();
  for (int i = 0; i < iters && captured.ok(); ++i) captured = fn(i);
  CUDA_RETURN_IF_ERROR(cudaStreamEndCapture(stream, &graph));
  RETURN_IF_ERROR(captured);
  cudaGraphExec_t exec;
  CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream));  // warm-up
  constexpr int kReplays = 3;
  absl::StatusOr<double> us = ElapsedUs(stream, [&]() -> absl::Status {
    for (int r = 0; r < kReplays; ++r) CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream));
    return absl::OkStatus();
  });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  if (!us.ok()) return us.status();
  return *us / (kReplays * iters);
}

struct Pool {
  void* data = nullptr;
  int64_t num_blocks = 0;
};

// Device state of one (KVP, batch) config, for rank 0 of the group.
struct Config {
  int64_t kvp = 1, batch = 1, local = 0;  // local: rank 0's tokens of each request
  int64_t blocks_per_seq = 0, sets = 1;   // block tables: `sets` rotating sets of batch rows
  int32_t *tables, *qsl, *lens, *local_lens;
  __nv_bfloat16 *q, *out, *merged;
  float *lse, *merged_lse;
  uint8_t *workspace = nullptr, *send;
  PagedAttentionPlan plan;
  DcpExchangeLayout layout;
  cudaStream_t stream = nullptr;
};

absl::Status SetUp(const Pool& pool, int num_sms, std::mt19937& rng, DeviceArena& arena,
                   Config& c) {
  c.local = DcpLocalCount(kContext, {c.kvp, 0, kBlock});
  c.blocks_per_seq = (c.local + kBlock - 1) / kBlock;
  const int64_t needed = c.batch * c.blocks_per_seq;
  c.sets = std::clamp<int64_t>(pool.num_blocks / needed, 1, 16);
  std::vector<int32_t> perm(pool.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  perm.resize(c.sets * needed);
  std::vector<int32_t> qsl(c.batch + 1), lens(c.batch, kContext), local_lens(c.batch, c.local);
  std::iota(qsl.begin(), qsl.end(), 0);
  c.layout = {
      .num_tokens = c.batch, .num_heads = kHq, .head_dim = kD, .dcp_size = c.kvp, .elem_bytes = 2};
  RETURN_IF_ERROR(c.layout.Validate());
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
  const int64_t rows = c.batch * kHq;
  RETURN_IF_ERROR(arena.Alloc(perm.size(), &c.tables));
  RETURN_IF_ERROR(arena.Alloc(c.batch + 1, &c.qsl));
  RETURN_IF_ERROR(arena.Alloc(c.batch, &c.lens));
  RETURN_IF_ERROR(arena.Alloc(c.batch, &c.local_lens));
  RETURN_IF_ERROR(arena.Alloc(rows * kD, &c.q));
  RETURN_IF_ERROR(arena.Alloc(rows * kD, &c.out));
  RETURN_IF_ERROR(arena.Alloc(rows, &c.lse));
  RETURN_IF_ERROR(arena.Alloc(rows * kD, &c.merged));
  RETURN_IF_ERROR(arena.Alloc(rows, &c.merged_lse));
  RETURN_IF_ERROR(arena.Alloc(c.layout.BufferBytes(), &c.send));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(c.tables, perm.data(), perm.size() * 4, cudaMemcpyHostToDevice));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(c.qsl, qsl.data(), qsl.size() * 4, cudaMemcpyHostToDevice));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(c.lens, lens.data(), c.batch * 4, cudaMemcpyHostToDevice));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(c.local_lens, local_lens.data(), c.batch * 4, cudaMemcpyHostToDevice));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(c.q, pool.data, rows * kD * 2, cudaMemcpyDeviceToDevice));
  const PagedAttentionPlanInput in{.num_seqs = c.batch,
                                   .num_tokens = c.batch,
                                   .max_q_len = 1,
                                   .max_seq_len = c.local,
                                   .num_q_heads = kHq,
                                   .num_kv_heads = kHkv,
                                   .head_dim = kD,
                                   .kv_dtype = KvDtype::kBf16,
                                   .num_sms = num_sms};
  ASSIGN_OR_RETURN(c.plan, PlanPagedAttention(in));
  if (c.plan.workspace_bytes > 0) {
    RETURN_IF_ERROR(arena.Alloc(c.plan.workspace_bytes, &c.workspace));
  }
  return absl::OkStatus();
}

// Times one config (graph replay per phase and in total, plus the eager total) and prints its row.
absl::Status TimeConfig(const Pool& pool, const Config& c, double* attn_kvp1_us) {
  const int64_t kvp = c.kvp, batch = c.batch;
  const DeviceKvCache cache{.data = pool.data,
                            .layout = {.num_blocks = pool.num_blocks,
                                       .num_layers = 1,
                                       .block_size = kBlock,
                                       .num_kv_heads = kHkv,
                                       .head_dim = kD}};
  AttentionParams params{.scale = 0.0884f};
  params.dcp_size = kvp;
  params.dcp_rank = 0;
  params.dcp_interleave = kBlock;
  auto attention = [&](int i) {
    const AttentionBatch b{.query_start_loc = c.qsl,
                           .seq_lens = c.lens,
                           .block_tables = c.tables + (i % c.sets) * batch * c.blocks_per_seq,
                           .num_seqs = batch,
                           .max_blocks_per_seq = c.blocks_per_seq,
                           .local_seq_lens = c.local_lens};
    return PagedAttention<__nv_bfloat16>(c.q, cache, 0, b, params, c.plan, c.out, c.lse,
                                         c.workspace, c.stream);
  };
  auto pack = [&](int) {
    return DcpPackForExchange<__nv_bfloat16>(c.out, c.lse, c.layout, c.send, c.stream);
  };
  auto merge = [&](int) {
    return DcpMergeReceived<__nv_bfloat16>(c.send, c.layout, c.merged, c.merged_lse, c.stream);
  };
  auto total = [&](int i) -> absl::Status {
    RETURN_IF_ERROR(attention(i));
    if (kvp == 1) return absl::OkStatus();  // no exchange without context parallelism
    RETURN_IF_ERROR(pack(i));
    return merge(i);
  };
  const double kv_bytes = static_cast<double>(batch) * c.local * kHkv * kD * 2 * 2;
  // ~20 ms of attention per measurement (20 to 2000 calls).
  const int iters = static_cast<int>(std::clamp(20e-3 / (kv_bytes / 3e12), 20.0, 2000.0));
  ASSIGN_OR_RETURN(const double attn_us, GraphUs(attention, iters, c.stream));
  double pack_us = 0, merge_us = 0;
  if (kvp > 1) {
    ASSIGN_OR_RETURN(pack_us, GraphUs(pack, 200, c.stream));
    ASSIGN_OR_RETURN(merge_us, GraphUs(merge, 200, c.stream));
  }
  ASSIGN_OR_RETURN(const double total_us, GraphUs(total, iters, c.stream));
  ASSIGN_OR_RETURN(const double eager_us, EagerUs(total, iters, c.stream));
  if (kvp == 1) *attn_kvp1_us = attn_us;
  std::printf("%4lld %6lld %6lld %7d %8.1f %8.1f %8.1f %9.1f %9.1f %8.2fx %10lld %8.0f\n",
              static_cast<long long>(kvp), static_cast<long long>(batch),
              static_cast<long long>(c.local), c.plan.num_splits, attn_us, pack_us, merge_us,
              total_us, eager_us, *attn_kvp1_us / total_us,
              static_cast<long long>(kvp > 1 ? c.layout.BufferBytes() : 0),
              kv_bytes / (attn_us * 1e-6) / 1e9);
  return absl::OkStatus();
}

// One row of the table.
absl::Status RunConfig(const Pool& pool, int num_sms, int64_t kvp, int64_t batch, std::mt19937& rng,
                       double* attn_kvp1_us) {
  DeviceArena arena;
  Config c;
  c.kvp = kvp;
  c.batch = batch;
  const absl::Status status = SetUp(pool, num_sms, rng, arena, c);
  const absl::Status timed = status.ok() ? TimeConfig(pool, c, attn_kvp1_us) : status;
  if (c.stream != nullptr) cudaStreamDestroy(c.stream);
  return timed;
}

absl::Status Run() {
  cudaDeviceProp prop{};
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  std::printf(
      "device: %s, %d SMs; DCP rank 0 per layer: 32 q / 8 kv heads, d128, bf16, block 16 = "
      "interleave, q_len 1, TP_A 1\n",
      prop.name, prop.multiProcessorCount);
  // 2 GiB: >= 2 x the largest config's KV (batch 8 x 32k = 1 GiB), so tables rotate.
  Pool pool;
  pool.num_blocks = (int64_t{2} << 30) / kBlockBytes;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&pool.data, pool.num_blocks * kBlockBytes));
  RETURN_IF_ERROR(FillRandomBf16(pool.data, pool.num_blocks * kBlockBytes));
  std::printf("%4s %6s %6s %7s %8s %8s %8s %9s %9s %9s %10s %8s\n", "kvp", "batch", "local",
              "splits", "attn_us", "pack_us", "merge_us", "total_us", "eager_us", "vs_kvp1",
              "a2a_bytes", "attnGB/s");
  std::mt19937 rng(7);
  for (int64_t batch : {1, 8}) {
    double attn_kvp1_us = 0;
    for (int64_t kvp : {1, 2, 4, 8}) {
      RETURN_IF_ERROR(RunConfig(pool, prop.multiProcessorCount, kvp, batch, rng, &attn_kvp1_us));
    }
  }
  std::printf(
      "context 32768 (local: rank 0's share). *_us: CUDA-graph replay (device time); eager_us: the "
      "total launched call by call (host launch cost included). vs_kvp1: KVP=1 attention / this "
      "row's total, the per-rank speedup before the all-to-all; a2a_bytes: what rank 0 sends "
      "(and receives) per layer.\n");
  CUDA_RETURN_IF_ERROR(cudaFree(pool.data));
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::kernels::cuda

int main() {
  const absl::Status status = tandem::kernels::cuda::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "dcp_attention_cuda_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
