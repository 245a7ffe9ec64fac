// The FP8 experts' activation passes (moe_fp8_cuda.h): MoeGatherFp8Rows and MoeSiluAndMulQuantFp8.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_cuda.h"
#include "kernels/moe/moe_cuda.h"
#include "kernels/moe/moe_fp8_cuda.h"

namespace tandem::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 32;  // a warp per row
constexpr int kChunk = 8;                     // columns a lane takes at a time (16 bytes of bf16)
constexpr int kBatch = 4;                     // the gather's 16-byte loads in flight a lane

__device__ __forceinline__ uint8_t ToE4m3(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// QuantizeActivations' scale: amax / 448, 1 for an all-zero row or group.
__device__ __forceinline__ float ScaleFor(float amax) {
  return amax > 0.0f ? amax / kFp8E4m3Max : 1.0f;
}

// Warp w of the block: row blockIdx.x * kRowsPerBlock + w. Lane l copies the row's 16-byte chunks
// l, l + 32, ... (kBatch loads in flight before their stores) and its scales (groups floats, 1 for
// per-token, none for static).
__global__ void __launch_bounds__(kThreads)
    GatherFp8RowsKernel(const uint8_t* __restrict__ codes, const float* __restrict__ scales,
                        int64_t k, int64_t scales_per_row, const int32_t* __restrict__ token_of_row,
                        int64_t rows, uint8_t* __restrict__ out_codes,
                        float* __restrict__ out_scales) {
  const int lane = threadIdx.x & 31;
  const int64_t r = int64_t{blockIdx.x} * kRowsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int64_t t = token_of_row[r], n = k / 16;
  const uint4* src = reinterpret_cast<const uint4*>(codes + t * k);
  uint4* dst = reinterpret_cast<uint4*>(out_codes + r * k);
  for (int64_t base = 0; base < n; base += 32 * kBatch) {
    uint4 v[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t i = base + 32 * b + lane;
      if (i < n) v[b] = src[i];
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t i = base + 32 * b + lane;
      if (i < n) dst[i] = v[b];
    }
  }
  for (int64_t g = lane; g < scales_per_row; g += 32) {
    out_scales[r * scales_per_row + g] = scales[t * scales_per_row + g];
  }
}

// SiluMulKernel's value (moe_expert_cuda.cu): bf16(g / (1 + expf(-g)) * u) on bf16 g and u.
__device__ __forceinline__ bf16 SiluMul(bf16 g, bf16 u) {
  const float gf = __bfloat162float(g), uf = __bfloat162float(u);
  return __float2bfloat16(gf / (1.0f + expf(-gf)) * uf);
}

// Lane's chunk `chunk` of the row: v = the 8 rounded act values; written to act_row if set.
__device__ __forceinline__ void ActChunk(const bf16* gate_row, int64_t inter, int64_t chunk,
                                         bf16* act_row, bf16 (&v)[kChunk]) {
  const uint4 gv = reinterpret_cast<const uint4*>(gate_row)[chunk];
  const uint4 uv = reinterpret_cast<const uint4*>(gate_row + inter)[chunk];
  const bf16* g = reinterpret_cast<const bf16*>(&gv);
  const bf16* u = reinterpret_cast<const bf16*>(&uv);
#pragma unroll
  for (int j = 0; j < kChunk; ++j) v[j] = SiluMul(g[j], u[j]);
  if (act_row != nullptr) reinterpret_cast<uint4*>(act_row)[chunk] = *reinterpret_cast<uint4*>(v);
}

__device__ __forceinline__ float ChunkMax(const bf16 (&v)[kChunk]) {
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < kChunk; ++j) m = fmaxf(m, fabsf(__bfloat162float(v[j])));
  return m;
}

// The chunk's codes (IEEE division by the scale, round to nearest even, saturating).
__device__ __forceinline__ void StoreCodes(const bf16 (&v)[kChunk], float scale, uint8_t* dst) {
  uint8_t c[kChunk];
#pragma unroll
  for (int j = 0; j < kChunk; ++j) c[j] = ToE4m3(__bfloat162float(v[j]) / scale);
  *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<uint2*>(c);
}

// kDynamicGroup128: a warp per two groups of 128 columns of a row of gate_up [rows, 2 * inter]
// (warp w: row w / tasks_per_row, chunks 32 (w % tasks_per_row) + lane), a group being 16 chunks,
// one half-warp; its amax by shuffles within the half-warp. Every warp one step, so decode-sized
// calls (a few rows) spread over many warps instead of walking a row's groups in turn.
__global__ void __launch_bounds__(kThreads)
    SiluMulQuantGroupsKernel(const bf16* __restrict__ gate_up, int64_t rows, int64_t inter,
                             int64_t tasks_per_row, bf16* __restrict__ act,
                             uint8_t* __restrict__ codes, float* __restrict__ scales) {
  const int lane = threadIdx.x & 31;
  const int64_t task = int64_t{blockIdx.x} * kRowsPerBlock + (threadIdx.x >> 5);
  if (task >= rows * tasks_per_row) return;  // whole warps: the shuffles see full warps
  const int64_t r = task / tasks_per_row, chunks = inter / kChunk, groups = (inter + 127) / 128;
  const int64_t chunk = task % tasks_per_row * 32 + lane;
  bf16 v[kChunk];
  float amax = 0.0f;
  if (chunk < chunks) {
    ActChunk(gate_up + r * 2 * inter, inter, chunk, act == nullptr ? nullptr : act + r * inter, v);
    amax = ChunkMax(v);
  }
#pragma unroll
  for (int off = 8; off > 0; off >>= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  }
  const float scale = ScaleFor(amax);
  if (chunk < chunks) {
    StoreCodes(v, scale, codes + r * inter + chunk * kChunk);
    if ((lane & 15) == 0) scales[r * groups + chunk / 16] = scale;
  }
}

// Per-token rows up to this width keep their rounded act values in shared memory between the
// amax and the codes (a warp's row: inter bf16; 8 warps: 48 KB at this width, the default limit).
constexpr int64_t kStashMaxInter = 3072;

// kDynamicToken, inter <= kStashMaxInter: a warp per row; the first pass writes each chunk's
// rounded act values into the warp's shared-memory row as it takes the amax, the second reads
// them back for the codes (SiluMulQuantKernel's second pass recomputes them: the same bits).
__global__ void __launch_bounds__(kThreads)
    SiluMulQuantTokenStashKernel(const bf16* __restrict__ gate_up, int64_t rows, int64_t inter,
                                 bf16* __restrict__ act, uint8_t* __restrict__ codes,
                                 float* __restrict__ scales) {
  extern __shared__ uint4 stash_rows[];  // kRowsPerBlock rows of inter / 8 chunks
  const int lane = threadIdx.x & 31;
  const int64_t r = int64_t{blockIdx.x} * kRowsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int64_t chunks = inter / kChunk;
  uint4* stash = stash_rows + (threadIdx.x >> 5) * chunks;
  const bf16* gate_row = gate_up + r * 2 * inter;
  bf16* act_row = act == nullptr ? nullptr : act + r * inter;
  bf16 v[kChunk];
  float amax = 0.0f;
  for (int64_t chunk = lane; chunk < chunks; chunk += 32) {
    ActChunk(gate_row, inter, chunk, act_row, v);
    amax = fmaxf(amax, ChunkMax(v));
    stash[chunk] = *reinterpret_cast<const uint4*>(v);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  }
  const float scale = ScaleFor(amax);
  if (lane == 0) scales[r] = scale;
  uint8_t* code_row = codes + r * inter;
  for (int64_t chunk = lane; chunk < chunks; chunk += 32) {  // the lane's own chunks: no barrier
    *reinterpret_cast<uint4*>(v) = stash[chunk];
    StoreCodes(v, scale, code_row + chunk * kChunk);
  }
}

// A warp per row of gate_up [rows, 2 * inter] for the per-token (wider than kStashMaxInter) and
// static schemes. kDynamicToken: the row's amax over the warp, then a second pass recomputes the
// chunks (the same bits) for their codes. kStaticTensor: the given scale. (Loading 4 chunks a lane
// before using them measured slower on an H200: kernels/moe/BENCHMARKS.md, nineteenth session.)
__global__ void __launch_bounds__(kThreads)
    SiluMulQuantKernel(const bf16* __restrict__ gate_up, int64_t rows, int64_t inter, int scheme,
                       float static_scale, bf16* __restrict__ act, uint8_t* __restrict__ codes,
                       float* __restrict__ scales) {
  const int lane = threadIdx.x & 31;
  const int64_t r = int64_t{blockIdx.x} * kRowsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const bf16* gate_row = gate_up + r * 2 * inter;
  bf16* act_row = act == nullptr ? nullptr : act + r * inter;
  uint8_t* code_row = codes + r * inter;
  const int64_t chunks = inter / kChunk;
  bf16 v[kChunk];
  float scale = static_scale;
  if (scheme == static_cast<int>(Fp8ActivationScheme::kDynamicToken)) {
    float amax = 0.0f;
    for (int64_t chunk = lane; chunk < chunks; chunk += 32) {
      ActChunk(gate_row, inter, chunk, act_row, v);
      amax = fmaxf(amax, ChunkMax(v));
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    }
    scale = ScaleFor(amax);
    if (lane == 0) scales[r] = scale;
    for (int64_t chunk = lane; chunk < chunks; chunk += 32) {
      ActChunk(gate_row, inter, chunk, nullptr, v);
      StoreCodes(v, scale, code_row + chunk * kChunk);
    }
    return;
  }
  if (r == 0 && lane == 0) scales[0] = static_scale;
  for (int64_t chunk = lane; chunk < chunks; chunk += 32) {
    ActChunk(gate_row, inter, chunk, act_row, v);
    StoreCodes(v, scale, code_row + chunk * kChunk);
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// SiluMulQuantTokenStashKernel unless TANDEM_MOE_FP8_SILU_STASH=0 (read once: A/B runs against the
// recomputing second pass, the same bits).
bool StashOn() {
  static const bool on = [] {
    const char* env = std::getenv("TANDEM_MOE_FP8_SILU_STASH");
    return env == nullptr || std::string(env) != "0";
  }();
  return on;
}

unsigned RowBlocks(int64_t rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

}  // namespace

absl::Status MoeGatherFp8Rows(const uint8_t* codes, const float* scales, int64_t k,
                              Fp8ActivationScheme scheme, const int32_t* token_of_row, int64_t rows,
                              uint8_t* out_codes, float* out_scales, cudaStream_t stream) {
  if (scheme == Fp8ActivationScheme::kNone || k < 16 || k % 16 != 0 || rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoeGatherFp8Rows: k ", k, " (a positive multiple of 16), rows ", rows,
                     ", scheme ", static_cast<int>(scheme), " (an FP8 one)"));
  }
  if (codes == nullptr || out_codes == nullptr || token_of_row == nullptr ||
      (scheme != Fp8ActivationScheme::kStaticTensor &&
       (scales == nullptr || out_scales == nullptr))) {
    return absl::InvalidArgumentError("MoeGatherFp8Rows: null pointer");
  }
  if (!Aligned16(codes) || !Aligned16(out_codes)) {
    return absl::InvalidArgumentError("MoeGatherFp8Rows: codes must be 16-byte aligned");
  }
  if (rows == 0) return absl::OkStatus();
  const int64_t per_row = scheme == Fp8ActivationScheme::kDynamicGroup128 ? (k + 127) / 128
                          : scheme == Fp8ActivationScheme::kDynamicToken  ? 1
                                                                          : 0;
  GatherFp8RowsKernel<<<RowBlocks(rows), kThreads, 0, stream>>>(
      codes, scales, k, per_row, token_of_row, rows, out_codes, out_scales);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status MoeSiluAndMulQuantFp8(const __nv_bfloat16* gate_up, int64_t rows, int64_t inter,
                                   Fp8ActivationScheme scheme, float static_scale,
                                   __nv_bfloat16* act, uint8_t* codes, float* scales,
                                   cudaStream_t stream) {
  if (scheme == Fp8ActivationScheme::kNone || rows < 0 || inter < 1 || gate_up == nullptr ||
      codes == nullptr || scales == nullptr ||
      (scheme == Fp8ActivationScheme::kStaticTensor && !(static_scale > 0.0f))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoeSiluAndMulQuantFp8: rows ", rows, ", width ", inter, ", scheme ",
        static_cast<int>(scheme), " (an FP8 one; a positive static scale), non-null pointers"));
  }
  if (rows == 0) return absl::OkStatus();
  if (inter % kChunk != 0 || !Aligned16(gate_up) || !Aligned16(act) || !Aligned16(codes)) {
    // The two kernels in sequence (the same bits); needs the act rows.
    if (act == nullptr) {
      return absl::InvalidArgumentError(
          "MoeSiluAndMulQuantFp8: a width off 8 columns or unaligned rows need the act output");
    }
    RETURN_IF_ERROR(MoeSiluAndMul<bf16>(gate_up, rows, inter, act, stream));
    return QuantizeActivations(act, rows, inter, scheme, static_scale, codes, scales, stream);
  }
  if (scheme == Fp8ActivationScheme::kDynamicGroup128) {
    const int64_t tasks_per_row = (inter / kChunk + 31) / 32;
    SiluMulQuantGroupsKernel<<<RowBlocks(rows * tasks_per_row), kThreads, 0, stream>>>(
        gate_up, rows, inter, tasks_per_row, act, codes, scales);
  } else if (scheme == Fp8ActivationScheme::kDynamicToken && inter <= kStashMaxInter && StashOn()) {
    const size_t smem = static_cast<size_t>(kRowsPerBlock) * inter * sizeof(bf16);
    SiluMulQuantTokenStashKernel<<<RowBlocks(rows), kThreads, smem, stream>>>(gate_up, rows, inter,
                                                                              act, codes, scales);
  } else {
    SiluMulQuantKernel<<<RowBlocks(rows), kThreads, 0, stream>>>(
        gate_up, rows, inter, static_cast<int>(scheme), static_scale, act, codes, scales);
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
