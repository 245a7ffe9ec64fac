// The mixture-of-experts layer's kernels on the device (bf16 / fp16 weights and activations, fp32
// routing and accumulation), mirroring the CPU reference in moe.h step by step:
//
//   MoeRoute          router logits [T, E] fp32 -> top-k ids + weights (every routing variant
//                     of GroupedRoutingParams: softmax / sigmoid, groups, bias, renormalise,
//                     routed_scaling_factor), ties to the lower id as on the CPU;
//   MoePermute        (token, j) pairs grouped by expert: counts, offsets, the active-expert list
//                     and a stable row order (token order within an expert, as PermuteByExpert);
//   MoeGatherRows     the permuted batch [rows, H] (the grouped-GEMM path);
//   MoePadRows        the permuted batch padded to `cap` rows per expert [E * cap, H] (the
//                     strided-batched GEMM path: fixed shapes, no host sync, capturable);
//   MoeExpertGemv*    decode: each active expert's rows against only that expert's weights
//                     (gate_up with SiLU-and-mul folded in, then down), the gather folded in;
//   MoeCombine        out[t] = sum_j w[t, j] * expert_out[row of (t, j)], j in order (no atomics:
//                     deterministic), plus an optional shared expert, sigmoid-gated or not.
//
// Launch sizes depend only on host values known before the step (T, k, E), never on the
// routing, so every function here is capturable in a CUDA graph and none syncs the host. The
// prefill path's grouped GEMM (moe_gemm_cuda.h) is the one place that reads the counts back.
//
// Thread safety: stateless; asynchronous on `stream`.
#ifndef TANDEM_KERNELS_MOE_MOE_CUDA_H_
#define TANDEM_KERNELS_MOE_MOE_CUDA_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/moe/moe.h"

namespace tandem::kernels::cuda {

// Experts a device routing / permutation handles (shared-memory tables per block).
inline constexpr int64_t kMoeMaxExperts = 512;

// Device buffers of one permutation of up to `rows` = T * k routing pairs over E experts.
struct DeviceMoePermutation {
  int32_t* expert_offsets = nullptr;  // [E + 1]: rows of expert e are [offsets[e], offsets[e+1])
  int32_t* active_experts = nullptr;  // [E]: experts with >= 1 row, ascending; then -1
  int32_t* token_of_row = nullptr;    // [rows]: the token a permuted row holds
  int32_t* row_of_pair = nullptr;     // [rows]: permuted row of routing pair t * k + j
};

// router_logits: [T, E] fp32 (device); params.correction_bias: [E] fp32 DEVICE pointer or null.
// expert_ids / weights: [T, k] (device), j = 0..k-1 in decreasing choice. Exactly the CPU's
// GroupedTopK (with num_groups = 1, softmax, no bias, scale 1: SoftmaxTopK) up to fp32 rounding
// of the softmax sum. INVALID_ARGUMENT as GroupedTopK's checks, or E > kMoeMaxExperts.
absl::Status MoeRoute(const float* router_logits, int64_t num_tokens,
                      const GroupedRoutingParams& params, int32_t* expert_ids, float* weights,
                      cudaStream_t stream);

// Groups the T * k pairs of expert_ids ([T, k], ids in [0, E)) by expert, stable in pair order
// (= the CPU's PermuteByExpert). expert_load: [E] int64 (device) or null; when given, each
// expert's row count is ADDED to it (per-expert load metrics, no host sync). One block.
// INVALID_ARGUMENT for E outside [1, kMoeMaxExperts] or k < 1. Ids outside [0, E) are
// undefined behaviour (MoeRoute never produces them).
absl::Status MoePermute(const int32_t* expert_ids, int64_t num_tokens, int64_t top_k,
                        int64_t num_experts, const DeviceMoePermutation& perm, int64_t* expert_load,
                        cudaStream_t stream);

// MoeRoute then MoePermute in ONE launch for decode-sized steps (one block: a warp routes each
// token with its scores in registers, the block permutes the ids from shared memory; the load
// counters are read right after the PDL wait so their latency hides under the routing; measured
// in moe_route_cuda_bench): the same expert_ids, weights and
// permutation, bit for bit, as the two calls. Needs MoeRouteAndPermuteSupported: E <=
// kMoeFusedMaxExperts and T * k <= kMoeFusedMaxPairs (INVALID_ARGUMENT naming the numbers
// otherwise, or as MoeRoute's checks). programmatic_launch: launched with programmatic stream
// serialization (PDL, sm_90): the kernel waits for the preceding grid before it reads the logits
// and lets its own successor launch early (see kernels/gemm/cuda/gemv_cuda.h); under capture too.
inline constexpr int64_t kMoeFusedMaxExperts = 128;
inline constexpr int64_t kMoeFusedMaxPairs = 1024;
bool MoeRouteAndPermuteSupported(const GroupedRoutingParams& params, int64_t num_tokens);
absl::Status MoeRouteAndPermute(const float* router_logits, int64_t num_tokens,
                                const GroupedRoutingParams& params, int32_t* expert_ids,
                                float* weights, const DeviceMoePermutation& perm,
                                int64_t* expert_load, cudaStream_t stream,
                                bool programmatic_launch = false);

// out[r, :] = x[token_of_row[r], :] for r < rows; x [T, hidden], out [rows, hidden].
template <typename T>
absl::Status MoeGatherRows(const T* x, int64_t hidden, const int32_t* token_of_row, int64_t rows,
                           T* out, cudaStream_t stream);

// Decode-size expert products (one warp streams two weight rows of one active expert at once:
// gate_up's gate and up rows of one output, or two output features of down; weights streamed
// once per chunk of that expert's rows; only the routed experts' weights are read).
// GateUp: act[r, j] = round(silu(g) * u), g = round(x_t . gate_up[e, j]), u = round(x_t .
// gate_up[e, inter + j]), t = token_of_row[r], for every row r of every expert e:
//   x [T, hidden]; gate_up [E, 2 * inter, hidden]; act [rows, inter].
// Down: out[r, h] = round(act[r] . down[e, h]): down [E, hidden, inter]; out [rows, hidden].
// `rows` = T * k (host): bounds the grid. Any hidden / inter >= 1 (16-byte loads where rows are
// aligned and a multiple of 8 wide, else element loads). INVALID_ARGUMENT for bad sizes.
// programmatic_launch: PDL as MoeRouteAndPermute's (each block waits for the preceding grid
// before its first read).
template <typename T>
absl::Status MoeExpertGemvGateUp(const T* x, const T* gate_up, int64_t hidden, int64_t inter,
                                 const DeviceMoePermutation& perm, int64_t num_experts,
                                 int64_t rows, T* act, cudaStream_t stream,
                                 bool programmatic_launch = false);
template <typename T>
absl::Status MoeExpertGemvDown(const T* act, const T* down, int64_t hidden, int64_t inter,
                               const DeviceMoePermutation& perm, int64_t num_experts, int64_t rows,
                               T* out, cudaStream_t stream, bool programmatic_launch = false);

// out[r, j] = round(silu(g) * u) for r < rows, j < inter, g / u = gate_up[r, j] / [r, inter + j]
// (SiluAndMul's expression, any width: layers_cuda.h's needs multiples of 8).
template <typename T>
absl::Status MoeSiluAndMul(const T* gate_up, int64_t rows, int64_t inter, T* out,
                           cudaStream_t stream);

// The padded layout: expert e's i-th row at e * cap + i (i < its count <= cap; rows past the
// count are not written). out [E * cap, hidden] = x[token_of_row[offsets[e] + i]];
// padded_row_of_pair [T * k] = ids[p] * cap + row_of_pair[p] - offsets[ids[p]] (the row each
// routing pair's expert output lands on, for MoeCombine). cap >= the largest count (T does).
template <typename T>
absl::Status MoePadRows(const T* x, int64_t hidden, const int32_t* expert_ids,
                        const DeviceMoePermutation& perm, int64_t num_experts, int64_t num_pairs,
                        int64_t cap, T* out, int32_t* padded_row_of_pair, cudaStream_t stream);

// The combine, one block per token (out may alias x: a token's row is read before written):
//   out[t] = round( sum_j weights[t, j] * expert_out[row_of_pair[t * k + j]]  (fp32, j order)
//                   + g_t * shared[t] ),
// g_t = sigmoid(x[t] . shared_gate) when shared_gate is given, 1 when only shared is, and no
// shared term when shared is null. expert_out [rows, hidden]; shared, x, out [T, hidden];
// shared_gate [hidden].
template <typename T>
absl::Status MoeCombine(const T* expert_out, const float* weights, const int32_t* row_of_pair,
                        int64_t num_tokens, int64_t top_k, int64_t hidden, const T* shared,
                        const T* shared_gate, const T* x, T* out, cudaStream_t stream);

// MoeCombine's contract, each token split over ceil(hidden / 512) blocks of 64 threads (16-byte
// loads of all k expert rows in flight; element loads where hidden % 8 or alignment forbid).
// Same j-order fp32 sum: identical results without a gated shared expert. Falls back to
// MoeCombine when a gated shared expert's x overlaps out, or past 65535 tokens.
// programmatic_launch: PDL as MoeRouteAndPermute's (not on the MoeCombine fallback).
template <typename T>
absl::Status MoeCombineSplit(const T* expert_out, const float* weights, const int32_t* row_of_pair,
                             int64_t num_tokens, int64_t top_k, int64_t hidden, const T* shared,
                             const T* shared_gate, const T* x, T* out, cudaStream_t stream,
                             bool programmatic_launch = false);

// The combine added into a residual stream (a decoder's batch-1 fold, where the next layer's
// norm reads the residual itself): residual[t] = round(residual[t] + round(MoeCombine's sum)),
// the rounded combine added as FusedAddRmsNorm updates its residual, so bit-identical to the
// combine into a buffer followed by FusedAddRmsNorm's residual update. `split`: the same kernel
// choice as MoeCombineSplit (true: with its fallback to MoeCombine's one block per token past
// 65535 tokens) or MoeCombine (false); programmatic_launch as MoeCombineSplit's (split kernel
// only). residual [T, hidden] must not overlap x. INVALID_ARGUMENT as MoeCombine, or for a null
// or overlapping residual.
template <typename T>
absl::Status MoeCombineAddTo(const T* expert_out, const float* weights, const int32_t* row_of_pair,
                             int64_t num_tokens, int64_t top_k, int64_t hidden, const T* shared,
                             const T* shared_gate, const T* x, T* residual, bool split,
                             cudaStream_t stream, bool programmatic_launch = false);

// Every expert's rows against its weights in ONE launch, sized by host values only (no offsets
// read-back: capturable), mma.sync bf16 / fp16 tensor cores, fp32 accumulation:
//   out[r, :n] = a[src(r), :k] . w[e]^T for every row r in [offsets[e], offsets[e+1]),
// src(r) = a_row_index[r] (the gather folded in; x [T, k] with token_of_row) or r when null;
// w [E, n, k]; out [rows, n]. 128-column tiles, 64- or 128-row tiles (by rows / E) that never
// straddle two experts; blocks walk (m-tile, n-tile) with the m-tiles of one n-tile adjacent, so
// an expert's weight tile is read from HBM once. `rows` (host) = offsets[E] or more: bounds the
// grid. Needs k % 8 == 0, n % 8 == 0, a / w 16-byte aligned, out 4-byte aligned:
// MoeGroupedMmaSupported; INVALID_ARGUMENT otherwise.
// MoeGroupedMmaInit(): the kernels' shared-memory opt-in on the current device; needed once
// before a MoeGroupedMma call made under stream capture (uncaptured calls make it themselves).
bool MoeGroupedMmaSupported(const void* a, const void* w, int64_t n, int64_t k);
absl::Status MoeGroupedMmaInit();
template <typename T>
absl::Status MoeGroupedMma(const T* a, const int32_t* a_row_index, const T* w,
                           const int32_t* expert_offsets, int64_t num_experts, int64_t rows,
                           int64_t n, int64_t k, T* out, cudaStream_t stream);

// MoeGroupedMma's contract on Hopper's warpgroup MMA (moe_grouped_wgmma_cuda.cu): one persistent
// CTA per SM, a producer warpgroup (cp.async for the gathered rows, TMA for the weights by
// default: MoeWgmmaProducer) feeding two wgmma consumer warpgroups through a 5-6 stage ring; 128 x
// 128 tiles (64 x 256 while experts average <= 64 rows) that never straddle two experts, walked
// expert by expert. MoeGroupedWgmmaSupported: MoeGroupedMmaSupported's conditions on an sm_90
// device (the kernel is built for sm_90a only); INVALID_ARGUMENT otherwise. MoeGroupedWgmmaInit():
// the shared-memory opt-in (a no-op off sm_90), needed once before a call made under stream
// capture.
bool MoeGroupedWgmmaSupported(const void* a, const void* w, int64_t n, int64_t k);
absl::Status MoeGroupedWgmmaInit();
template <typename T>
absl::Status MoeGroupedWgmma(const T* a, const int32_t* a_row_index, const T* w,
                             const int32_t* expert_offsets, int64_t num_experts, int64_t rows,
                             int64_t n, int64_t k, T* out, cudaStream_t stream);
// How MoeGroupedWgmma's producer publishes a stage of the ring (the results are bit-identical):
// kWaitGroup waits for its copies two stages back (cp.async.wait_group 2) and arrives, so at most
// 3 stages are in flight; kArriveNoinc arrives through cp.async.mbarrier.arrive.noinc as the
// copies land (the whole ring in flight); kTmaWeights is kArriveNoinc with the weight tiles loaded
// by TMA; kTmaOperands also loads A by TMA where it is not gathered (a_row_index null).
enum class MoeWgmmaProducer { kWaitGroup, kArriveNoinc, kTmaWeights, kTmaOperands };
// How MoeGroupedWgmma's two consumer warpgroups share the work (the results are bit-identical):
// kCooperative, both on every tile (each 64 rows of a 128 x 128 tile or 128 columns of a 64 x 256
// one), so both run their epilogue at once and the tensor cores idle meanwhile; kPingPong
// (CUTLASS's "pingpong"), each a whole tile in turn, one's epilogue overlapping the other's MMAs,
// the MMAs of a 128-row tile's last 64 rows skipped when they are all past the expert's rows;
// kCooperative128x256, 128 x 256 tiles (each warpgroup 64 rows, all 256 columns: a quarter less
// operand traffic per FLOP than 128 x 128) where experts average > 64 rows, kPingPong's 64 x 256
// tiles otherwise. kPingPong and kCooperative128x256 are built with the TMA producers only
// (kTmaWeights, kTmaOperands; INVALID_ARGUMENT otherwise).
enum class MoeWgmmaSchedule { kCooperative, kPingPong, kCooperative128x256 };
// MoeGroupedWgmma takes these (the fastest on nvidia-h200 for the Qwen3-30B-A3B and Mixtral-8x7B
// experts at 1,024 to 8,192 tokens: BENCHMARKS.md); MoeGroupedWgmmaWith names a producer and a
// schedule (benchmarks, tests).
inline constexpr MoeWgmmaProducer kMoeWgmmaDefaultProducer = MoeWgmmaProducer::kTmaOperands;
inline constexpr MoeWgmmaSchedule kMoeWgmmaDefaultSchedule = MoeWgmmaSchedule::kCooperative128x256;
template <typename T>
absl::Status MoeGroupedWgmmaWith(MoeWgmmaProducer producer, MoeWgmmaSchedule schedule, const T* a,
                                 const int32_t* a_row_index, const T* w,
                                 const int32_t* expert_offsets, int64_t num_experts, int64_t rows,
                                 int64_t n, int64_t k, T* out, cudaStream_t stream);
// gate_up with SiLU * up folded into its epilogue, on kCooperative128x256's tiles: each 256-column
// tile loads 128 gate rows and the same 128 up rows of gate_up [E, 2 * inter, k] (two TMA boxes),
// and stores act[r, j] = round(silu(g) * u), g / u the fp32 sums rounded to T first
// (MoeSiluAndMul's expression: bit-identical to MoeGroupedWgmmaWith(producer, kCooperative128x256)
// into gate_up [rows, 2 * inter] followed by MoeSiluAndMul), act [rows, inter]. No gate_up round
// trip through memory and no separate SiLU launch. MoeGroupedWgmma's conditions with n = 2 * inter,
// inter a multiple of 8, and a TMA producer; INVALID_ARGUMENT otherwise.
template <typename T>
absl::Status MoeGroupedWgmmaGateUpSilu(const T* a, const int32_t* a_row_index, const T* gate_up,
                                       const int32_t* expert_offsets, int64_t num_experts,
                                       int64_t rows, int64_t inter, int64_t k, T* act,
                                       cudaStream_t stream,
                                       MoeWgmmaProducer producer = kMoeWgmmaDefaultProducer);

#define TANDEM_MOE_CUDA_DECLARE(T)                                                                 \
  extern template absl::Status MoeGatherRows<T>(const T*, int64_t, const int32_t*, int64_t, T*,    \
                                                cudaStream_t);                                     \
  extern template absl::Status MoeExpertGemvGateUp<T>(const T*, const T*, int64_t, int64_t,        \
                                                      const DeviceMoePermutation&, int64_t,        \
                                                      int64_t, T*, cudaStream_t, bool);            \
  extern template absl::Status MoeExpertGemvDown<T>(const T*, const T*, int64_t, int64_t,          \
                                                    const DeviceMoePermutation&, int64_t, int64_t, \
                                                    T*, cudaStream_t, bool);                       \
  extern template absl::Status MoeSiluAndMul<T>(const T*, int64_t, int64_t, T*, cudaStream_t);     \
  extern template absl::Status MoePadRows<T>(const T*, int64_t, const int32_t*,                    \
                                             const DeviceMoePermutation&, int64_t, int64_t,        \
                                             int64_t, T*, int32_t*, cudaStream_t);                 \
  extern template absl::Status MoeCombine<T>(const T*, const float*, const int32_t*, int64_t,      \
                                             int64_t, int64_t, const T*, const T*, const T*, T*,   \
                                             cudaStream_t);                                        \
  extern template absl::Status MoeCombineSplit<T>(const T*, const float*, const int32_t*, int64_t, \
                                                  int64_t, int64_t, const T*, const T*, const T*,  \
                                                  T*, cudaStream_t, bool);                         \
  extern template absl::Status MoeCombineAddTo<T>(const T*, const float*, const int32_t*, int64_t, \
                                                  int64_t, int64_t, const T*, const T*, const T*,  \
                                                  T*, bool, cudaStream_t, bool);                   \
  extern template absl::Status MoeGroupedMma<T>(const T*, const int32_t*, const T*,                \
                                                const int32_t*, int64_t, int64_t, int64_t,         \
                                                int64_t, T*, cudaStream_t);                        \
  extern template absl::Status MoeGroupedWgmma<T>(const T*, const int32_t*, const T*,              \
                                                  const int32_t*, int64_t, int64_t, int64_t,       \
                                                  int64_t, T*, cudaStream_t);                      \
  extern template absl::Status MoeGroupedWgmmaWith<T>(                                             \
      MoeWgmmaProducer, MoeWgmmaSchedule, const T*, const int32_t*, const T*, const int32_t*,      \
      int64_t, int64_t, int64_t, int64_t, T*, cudaStream_t);                                       \
  extern template absl::Status MoeGroupedWgmmaGateUpSilu<T>(                                       \
      const T*, const int32_t*, const T*, const int32_t*, int64_t, int64_t, int64_t, int64_t, T*,  \
      cudaStream_t, MoeWgmmaProducer);
TANDEM_MOE_CUDA_DECLARE(__nv_bfloat16)
TANDEM_MOE_CUDA_DECLARE(__half)
#undef TANDEM_MOE_CUDA_DECLARE

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_MOE_MOE_CUDA_H_
