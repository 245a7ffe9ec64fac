// Weight-only use of an FP8 weight at batch 1 (W8A16, issue 38): out[1, n] = a[1, k] . W^T
// (+ bias), W = the e4m3 codes times their per-row scales, a the bf16 activations AS THEY ARE
// (no activation quantization, whatever the checkpoint's activation scheme: the product is
// closer to the unquantized model than the W8A8 one, and no producer has to write codes).
//
// Why: at batch 1 the FP8 decode step's GEMVs are 4-30 us each, and the activation
// quantization ahead of each (fused into RMSNorm / SiLU-and-mul, or QuantizeActivations before
// o_proj) adds 4 kernels a layer whose PDL handoffs cost about what the GEMVs gained
// (BENCHMARKS.md). With bf16 activations the residual add + RMSNorm and SiLU-and-mul fold into
// the GEMVs as they do for the bf16 model (kernels/gemm/cuda/gemv_cuda.h): a layer is qkv (input
// norm in its prologue, RoPE + KV write in its epilogue: Fp8W16GemvNormInRopeKv) -> attention ->
// o_proj (adds into the residual) -> gate_up + SiLU*up (post-attention norm in its prologue) ->
// down_proj (adds into the residual).
//
// The kernel (fp8_w8a16_gemv_cuda.cu) is the bf16 SmallMLinear's with 1-byte weights: one warp
// per output row (two rows, gate and up, for SiLU-and-mul) streams the row's e4m3 bytes with
// 16-byte evict-first loads, 8 in flight per lane; each code becomes an f16 with integer
// operations (exactly 2^-8 times its value, subnormals included), then fp32, multiplied with the
// bf16 activation in fp32 (fmaf); the warp's sum is scaled by 2^8 and the row's weight scale,
// the bias added, one rounding to TOut. The activations are read through L1 (plain, AddTo) or
// staged normalised in shared memory (NormIn, bit-identical to RmsNorm<bf16>: gemv_norm_stage.cuh).
//
// Numerics: cpu::Fp8Linear with Fp8ActivationScheme::kNone (fp8_linear.h) up to fp32 summation
// order. The folded forms are bit-identical to the unfolded compositions:
//   Fp8W16GemvNormIn        = RmsNorm<bf16> into a buffer, then Fp8W16Gemv<bf16>;
//   Fp8W16GemvNormInSiluMul = RmsNorm<bf16>, Fp8W16Gemv<bf16> into [2 * inter], SiluAndMul<bf16>;
//   Fp8W16GemvAddTo         = residual = round(residual + round(Fp8W16Gemv's value)), as
//                             FusedAddRmsNorm updates the residual.
//
// Supported weights: e4m3 codes [n, k] with k a positive multiple of 16 up to kFp8W16MaxK, scales
// constant along k (per-tensor as n copies, or per-channel: Fp8ScaleGrid block_rows 1, block_cols
// k), or GROUPED: one scale per row and 128-column group (block_rows 1, block_cols 128, scales
// [n, ceil(k / 128)] row-major, a partial last group its own; DeepSeek's 128 x 128 blocks held per
// row as the CUDA model's CudaFp8Weight::scales: Fp8W16GroupedScales), 16-byte aligned codes and
// activations, m == 1.
//
// Grouped weights run their own template instantiations of both inner loops (kGrouped; the
// per-row kernels' code is unchanged): the products of each 16-column chunk (kFp32Fma) or of each
// warp's 64-column mma group (kTensorCore, one 128-column group) are summed apart in fp32, times
// that group's scale, into the row's fp32 accumulators (fmaf); the group scales are loaded beside
// the weight bytes. The folded forms and kAuto work alike; kRing* have no grouped form and run
// kTensorCore. Numerics: cpu::Fp8Linear (kNone, which dequantizes each block with its scale) up
// to fp32 summation order.
//
// programmatic_launch: as SmallMLinear's (gemv_cuda.h): every warp waits for the preceding grid
// before it reads a, the norm weight, bias or the residual, or writes out. early_weight_loads:
// the warp's first 8 weight loads per lane are issued before that wait (the preceding grid must
// not write the weight codes); false issues them after it.
//
// Fp8W16Math picks the inner loop (same interface, A/B in one binary; decode steps:
// TANDEM_FP8_W16_MMA in runtime/cuda/cuda_llama_model_fp8.cc):
//   kFp32Fma      the above: codes to f16 by integer ops, then fp32 fmaf (~80 instructions a lane
//                 per 16 weight bytes: issue-bound on an H200, BENCHMARKS.md);
//   kTensorCore   16 rows a block, its 8 warps splitting k; codes to f16 by the hardware convert
//                 (exact), products on the tensor cores (mma.sync m16n8k16 f16 x f16, fp32
//                 accumulate) with the activations converted bf16 -> f16 once per block into
//                 shared memory (~23 SASS instructions a lane per 16 weight bytes). Numerics: the
//                 activations are exact in f16 for 2^-14 <= |x| <= 65504 (bf16's 8 significant
//                 bits fit f16's 11); below, f16 subnormals (absolute error <= 2^-25); above,
//                 they overflow to inf: not for activations past 65504. The sums are fp32 (the
//                 tensor core's accumulation order, 16 products a step). Folds bit-identical to
//                 the unfolded kernels of the same math.
//   kAuto         below.
//   kRing         kTensorCore's arithmetic and bits, the weights streamed through a shared-memory
//                 ring by 1-d bulk copies (fp8_w8a16_ring_cuda.cu): a persistent grid of one CTA
//                 an SM walking its 16-row tiles, up to 12 stages of 16 rows x 1024 columns in
//                 flight a CTA (the whole SM's shared memory), the first ones before the PDL
//                 wait, the activations staged once a CTA. Falls back to kTensorCore where the
//                 ring does not fit (staging past ~200 KiB).
//   kRing2        the same with two CTAs an SM, each half the SM's shared memory.
//   kRingHalf     one CTA an SM on half the shared memory: the next kernel's CTA fits beside it
//                 and issues its early loads while this one streams.
//                 Not yet measured on a GPU (issue 38): selectable only (TANDEM_FP8_W16_MMA=ring /
//                 ring2 / ringhalf in runtime/cuda/cuda_llama_model_fp8.cc).
//   kTensorCoreDeep    kTensorCore's tile, arithmetic and bits with twice the 16-byte weight
//                 loads in flight a lane (16; G = 8 groups a lane, 4 for SiLU-and-mul), still 2
//                 CTAs an SM (fp8_w8a16_deep_cuda.cu).
//   kTensorCoreSplitK  kTensorCore with S in {2, 4} CTAs a 16-row tile where the tiles are
//                 fewer than one wave of resident CTAs (e.g. n = 4096 on an H200), each taking a
//                 contiguous 128-column-aligned share of k; their fp32 tile sums meet in the
//                 caller's Fp8W16SplitKWorkspace and the tile's last CTA adds them in the fixed
//                 order s = 0 .. S - 1 and runs the epilogue. Deterministic run to run, NOT bit
//                 for bit kTensorCore (another fp32 sum order); every CTA runs the NormIn
//                 prologue. Without a workspace (null), or where S would be 1, or the workspace
//                 holds fewer tiles than ceil(n / 16): kTensorCore.
//                 Both selectable (TANDEM_FP8_W16_MMA=deep / splitk); measured on an H200
//                 (BENCHMARKS.md, fourteenth session): deep faster where its 2 CTAs an SM fill
//                 the waves better, split-k no better than deep anywhere.
//   kAutoWaves    Weights with scales constant along k: kTensorCoreWide (on an H200 3-14% faster
//                 than the choice below at every Llama-3-8B / 70B projection, 70B's down_proj with
//                 k = 28,672 included; BENCHMARKS.md, thirty-second session). Grouped weights:
//                 kAuto, but kTensorCoreDeep (the same bits) wherever kAuto takes kTensorCore and
//                 the 16-row tiles fit one wave of deep CTAs (<= 2 an SM) or exceed one wave of
//                 kTensorCore's (> 4 an SM): where the 4-CTA kernel's last wave is not full
//                 anyway or it is under one wave with slots idle, twice the loads in flight a lane
//                 win (H200, Llama-3-8B o / down / gate_up, 70B qkv / gate_up); between the two
//                 (8B qkv: 384 tiles, 70B o: 512) kTensorCore.
//   kTensorCorePersistent  kTensorCoreDeep's tiles, arithmetic and bits on a persistent grid of
//                 min(tiles, 2 x SMs) CTAs, each walking the tiles b, b + gridDim.x, ...: the
//                 activations (NormIn: the RmsNorm prologue) staged once a CTA instead of once a
//                 tile, the first tile's first loads before the PDL wait, each next tile's as soon
//                 as the previous tile's products are done. Selectable only
//                 (TANDEM_FP8_W16_MMA=persistent; issue 38).
//   kTensorCoreWide  kTensorCoreDeep's tiles, loads in flight and 2 CTAs an SM, each warp load
//                 reading 4 rows x 128 contiguous bytes instead of 8 rows x 64 (two lanes' A rows
//                 a weight row, two halves of each 128-column window, the product's diagonal
//                 kept: fp8_w8a16_wide_cuda.cu). Deterministic, NOT kTensorCore's bits (each row
//                 adds its two halves last). kAutoWaves' choice for scales constant along k;
//                 TANDEM_FP8_W16_MMA=wide forces it for grouped scales too. The RoPE fold
//                 (Fp8W16GemvNormInRopeKv) has it as well.
//
// Several tokens (m = 2 .. kFp8W16TokensMaxM, all four entry points; `math` and `split_k` are
// for m = 1 only): one kernel reads each weight byte once for the m tokens
// (fp8_w8a16_tokens_cuda.cu). kTensorCoreDeep's tiles, loads and mma, with the m16n8k16 B
// operand's 8 columns holding the tokens (lane g supplies token g's f16 activations, so the mma
// that multiplied one token 8 times multiplies 8 tokens), the m tokens' activations (kNormIn:
// their RmsNorms, each bit-identical to RmsNorm<bf16>) staged once a CTA on a persistent grid of
// min(16-row tiles, resident CTAs); the folds as above for every token. Numerics: cpu::Fp8Linear
// (kNone) per token up to fp32 summation order (the tensor-core form's products, f16 activations
// and their range); deterministic, not the one-token kernels' bits. Supported while the m staged
// rows (NormIn: and the norm weight) fit one CTA's kFp8W16TokensMaxSmemBytes with the kernel's
// static sums: Llama-3-8B's down_proj (k = 14,336) at 8 tokens, Llama-3-70B's (k = 28,672) up to
// 4; fast where two CTAs an SM fit (Fp8W16TokensTwoCtasPerSm). Why: at 2-8 tokens the W8A8 path
// quantizes the activations in 3 kernels a layer before its GEMVs (kernels/fp8/BENCHMARKS.md,
// thirty-fourth session).
//
// Thread safety: stateless; asynchronous on `stream`; usable inside CUDA graph capture.
#ifndef TANDEM_KERNELS_FP8_FP8_W8A16_GEMV_CUDA_H_
#define TANDEM_KERNELS_FP8_FP8_W8A16_GEMV_CUDA_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/fp8/fp8_cuda.h"
#include "kernels/gemm/cuda/gemv_cuda.h"

namespace tandem::kernels::cuda {

// The one-token forms' m (every Fp8W16Math); the multi-token form takes m up to
// kFp8W16TokensMaxM where its staging fits kFp8W16TokensMaxSmemBytes (sm_90's opt-in maximum a
// CTA: 227 KiB).
inline constexpr int64_t kFp8W16GemvMaxM = 1;
inline constexpr int64_t kFp8W16TokensMaxM = 8;
inline constexpr int64_t kFp8W16TokensMaxSmemBytes = 227 * 1024;
// The largest k (kTensorCore stages k f16 activations in shared memory: 128 KiB).
inline constexpr int64_t kFp8W16MaxK = 65536;

// The scale groups of a grouped weight (columns per group).
inline constexpr int64_t kFp8W16ScaleGroupCols = 128;

enum class Fp8W16Math {
  kFp32Fma,
  kTensorCore,
  kAuto,
  kRing,
  kRing2,
  kRingHalf,
  kTensorCoreDeep,
  kTensorCoreSplitK,
  kAutoWaves,
  kTensorCorePersistent,
  kTensorCoreWide
};
// kAuto: kTensorCore where its f16 activations fit the default 48 KiB of shared memory (the
// NormIn forms always; the others for k <= 24,576), else kFp32Fma (Llama-3-70B's down_proj, k =
// 28,672: 57 KiB a block cut the blocks a SM holds, 83 vs 63 us on an H200, BENCHMARKS.md).
inline constexpr int64_t kFp8W16AutoMaxStagingBytes = 48 * 1024;
// Shared memory the NormIn forms may use: the staged row and the norm weight, 2 * k * 2 bytes
// (k <= 12280).
inline constexpr int64_t kFp8W16NormInMaxSmemBytes = 48 * 1024;

// Fp8W16Math::kTensorCoreSplitK's workspace, owned by the caller (device memory it allocated,
// e.g. with Fp8W16SplitKWorkspaceBytes; this struct only points at it): fp32 tile partial sums
// and one ticket counter a tile. The counters must be zero before the first launch (cudaMemset
// once); every launch leaves them zero again (graph replays). Launches that share a workspace
// must run in one stream's order (under PDL too: the kernel touches it after the PDL wait).
inline constexpr int kFp8W16MaxSplits = 4;
struct Fp8W16SplitKWorkspace {
  float* partials = nullptr;         // [tiles, kFp8W16MaxSplits, 2 * 16] fp32
  unsigned int* counters = nullptr;  // [tiles]
  int64_t tiles = 0;                 // 16-row tiles it holds: ceil(n / 16) of the largest n
  int splits = 0;                    // S: 0 picked per launch from n, k and the SM count; else
                                     // forced (clamped to 4 and k's 128-column groups)
};
// Bytes of a workspace for weights of up to `weight_rows` rows (SiLU-and-mul: its 2 x inter):
// the partials, then the counters.
int64_t Fp8W16SplitKWorkspaceBytes(int64_t weight_rows);
// The workspace in `bytes` (Fp8W16SplitKWorkspaceBytes(weight_rows)) of device memory at base.
Fp8W16SplitKWorkspace Fp8W16SplitKWorkspaceAt(void* base, int64_t weight_rows, int splits = 0);

// True for a grid with one scale per row and 128-column group over more than one group (k > 128;
// at k <= 128 the same scales are per-channel).
bool Fp8W16GroupedScales(const Fp8ScaleGrid& grid);

// True when Fp8W16Gemv takes these arguments (the header comment's supported weights; m > 1:
// the m staged rows of k f16 and 2 KiB of sums in kFp8W16TokensMaxSmemBytes).
bool Fp8W16GemvSupported(const void* a, const Fp8DeviceWeight& w, int64_t m);
// ... and the NormIn forms: a non-null 16-byte aligned norm weight and the staging in
// kFp8W16NormInMaxSmemBytes (m > 1: m + 1 rows of k f16 and 4 KiB of sums in
// kFp8W16TokensMaxSmemBytes).
bool Fp8W16GemvNormInSupported(const void* x, const void* norm_weight, const Fp8DeviceWeight& w,
                               int64_t m);

// True when the multi-token form at m tokens keeps two CTAs an SM (its staging of m rows of k,
// NormIn: + the norm weight, and the sums of rows_per_set row sets, twice in an SM's 228 KiB). One
// CTA an SM streams the weights more slowly than the W8A8 GEMV (Llama-3-8B's down_proj at 4-8
// tokens, 70B's at 2-4: kernels/fp8/BENCHMARKS.md, thirty-fourth session): CudaLlamaModel's
// multi-token fold (TANDEM_FP8_W16_TOKENS=auto, the default) takes a step only where every
// projection keeps two.
bool Fp8W16TokensTwoCtasPerSm(int64_t m, int64_t k, bool norm_in, int rows_per_set);

// a: [m, k] bf16; w: [n, k]; bias: [n] bf16 or null; out: [m, n] of TOut (bf16 or float), not
// overlapping the inputs. INVALID_ARGUMENT (nothing launched) unless Fp8W16GemvSupported and out
// is non-null. split_k (all four forms): kTensorCoreSplitK's workspace, unused by the other maths.
template <typename TOut>
absl::Status Fp8W16Gemv(const __nv_bfloat16* a, const Fp8DeviceWeight& w, const __nv_bfloat16* bias,
                        int64_t m, TOut* out, cudaStream_t stream, bool programmatic_launch = false,
                        bool early_weight_loads = false, Fp8W16Math math = Fp8W16Math::kFp32Fma,
                        const Fp8W16SplitKWorkspace* split_k = nullptr);

// out = RmsNorm(x) . W^T (+ bias); x: [m, k] (the residual stream), norm_weight: [k]; out [m, n].
absl::Status Fp8W16GemvNormIn(const __nv_bfloat16* x, const __nv_bfloat16* norm_weight, float eps,
                              const Fp8DeviceWeight& w, const __nv_bfloat16* bias, int64_t m,
                              __nv_bfloat16* out, cudaStream_t stream,
                              bool programmatic_launch = false, bool early_weight_loads = false,
                              Fp8W16Math math = Fp8W16Math::kFp32Fma,
                              const Fp8W16SplitKWorkspace* split_k = nullptr);

// out[i, j] = SiLU(g) * u, g / u = the rounded products of RmsNorm(x) with rows j / inter + j of
// w ([2 * inter, k]: gate rows, then up rows) (+ bias [2 * inter]); out: [m, inter].
absl::Status Fp8W16GemvNormInSiluMul(const __nv_bfloat16* x, const __nv_bfloat16* norm_weight,
                                     float eps, const Fp8DeviceWeight& w, const __nv_bfloat16* bias,
                                     int64_t m, __nv_bfloat16* out, cudaStream_t stream,
                                     bool programmatic_launch = false,
                                     bool early_weight_loads = false,
                                     Fp8W16Math math = Fp8W16Math::kFp32Fma,
                                     const Fp8W16SplitKWorkspace* split_k = nullptr);

// residual[m, n] = round(residual + round(a . W^T (+ bias))), in place; residual not overlapping
// a, w or bias.
absl::Status Fp8W16GemvAddTo(const __nv_bfloat16* a, const Fp8DeviceWeight& w,
                             const __nv_bfloat16* bias, int64_t m, __nv_bfloat16* residual,
                             cudaStream_t stream, bool programmatic_launch = false,
                             bool early_weight_loads = false,
                             Fp8W16Math math = Fp8W16Math::kFp32Fma,
                             const Fp8W16SplitKWorkspace* split_k = nullptr);

// The qkv product of a batch-1 step with the input RMSNorm in its prologue (as Fp8W16GemvNormIn)
// and RoPE + the KV-pool write in its epilogue (as the bf16 SmallMLinearNormInRopeKv,
// kernels/gemm/cuda/gemv_cuda.h, whose GemvRopeKv it takes): one kernel instead of
// Fp8W16GemvNormIn into a qkv buffer + RopeQkvToCache (kernels/attention/cuda/rope_cache_cuda.h).
// w: [width, k], width = (num_q_heads + 2 * num_kv_heads) * head_dim (q, k, v rows), per-row or
// grouped scales; bias: [width] or null. q rotated into rope.q_out ([1, num_q_heads, head_dim]
// bf16), k rotated and v copied into the token's pool slot (skipped for slots < 0 or >=
// num_slots; the pool must hold bf16), with RopeQkvToCache's fp32 arithmetic; no qkv buffer.
// The tensor-core inner loop or its wide mapping (fp8_w8a16_rope_cuda.cu): a block multiplies the
// 16-row tile of 16 consecutive rows h * D + i0 .. of a head and the tile of their RoPE partners
// (+ D / 2), so each pair's two rounded products meet in one thread, and each row keeps its slot
// of Fp8W16GemvNormIn's tiles: q, k and v are bit for bit Fp8W16GemvNormIn (kTensorCore, or
// kTensorCoreWide where the wide mapping runs) + RopeQkvToCache. head_dim a multiple of 32 (the
// tiles). m = 1 only. INVALID_ARGUMENT (nothing launched) unless Fp8W16GemvNormInRopeKvSupported;
// callers fall back to the unfused pair.
bool Fp8W16GemvNormInRopeKvSupported(const void* x, const void* norm_weight,
                                     const Fp8DeviceWeight& w, int64_t m, const GemvRopeKv& rope,
                                     Fp8W16Math math);
// math: kTensorCore or kAuto (kAuto takes the tensor cores for every NormIn form), kTensorCoreWide,
// or kAutoWaves (wide for scales constant along k, else kTensorCore); the others (kFp32Fma, the
// rings, the other latency forms) are refused.
absl::Status Fp8W16GemvNormInRopeKv(const __nv_bfloat16* x, const __nv_bfloat16* norm_weight,
                                    float eps, const Fp8DeviceWeight& w, const __nv_bfloat16* bias,
                                    int64_t m, const GemvRopeKv& rope, cudaStream_t stream,
                                    bool programmatic_launch = false,
                                    bool early_weight_loads = false,
                                    Fp8W16Math math = Fp8W16Math::kAuto);

extern template absl::Status Fp8W16Gemv<__nv_bfloat16>(const __nv_bfloat16*, const Fp8DeviceWeight&,
                                                       const __nv_bfloat16*, int64_t,
                                                       __nv_bfloat16*, cudaStream_t, bool, bool,
                                                       Fp8W16Math, const Fp8W16SplitKWorkspace*);
extern template absl::Status Fp8W16Gemv<float>(const __nv_bfloat16*, const Fp8DeviceWeight&,
                                               const __nv_bfloat16*, int64_t, float*, cudaStream_t,
                                               bool, bool, Fp8W16Math,
                                               const Fp8W16SplitKWorkspace*);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_FP8_FP8_W8A16_GEMV_CUDA_H_
