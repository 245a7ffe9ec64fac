// kRows16 over an FP8 latent pool (issue 33): mla_decode_rows16.cu's kernel (16-row tiles,
// mma.sync m16n8k16, 8 warps, TMA tiles, the same grid, plan, workspace, in-kernel and cluster
// merges) reading the pool's e4m3 codes (half a bf16 pool's bytes) straight into the tensor cores.
// The 64-row FP8 wgmma kernel (mla_decode_fp8.cu) dequantizes every tile into a bf16 tile in
// shared memory and pads 16 heads to 64 rows: 1.1-1.7x the bf16 pool's time (BENCHMARKS.md).
//
// Loading: the codes as a 4-D tensor map [blocks][layers x page][9 chunks][64 bytes], one copy a
// box (a page run of up to 64 rows, every chunk: a 16-latent page makes 4 a tile; one copy a
// chunk and box cost the 16-latent pages ~35% in the bf16 kernel, BENCHMARKS.md), 64-byte swizzle
// (CodeOffset), the box's row scales by a bulk copy, one mbarrier a stage; four stages of 36 KiB.
// Warp 0 issues a tile, one lane a box.
// Math in fp16 whatever T (codes convert exactly to fp16: cvt.rn.f16x2.e4m3x2):
//   * Q: each row times a power of two (2^(14 - e), max|row| < 2^e) to fp16 once a CTA (exact in
//     fp16's normal range); the score is acc x 2^(e - 14) x the key's row scale;
//   * scores: the dot product's dims are permuted alike in Q and K (k16 slots {2c, 2c + 1, 2c + 8,
//     2c + 9} of step j of a 64-dim chunk are dims 16c + 4j + {0, 1, 2, 3}), so a lane's B
//     fragments of four k16 steps are one 16-byte shared load of its token's codes;
//   * P V: V's codes by ldmatrix.trans of code pairs (8 tokens x 8 pairs), a byte permute and the
//     conversion: tiles of the even and of the odd dims of each 16-dim unit (OutPairOf's FP8
//     layout); P = softmax weight x row scale / the tile's largest row scale S_t (in [0, 1], fp16's
//     range whatever the scales), O kept in units of the running S and rescaled with alpha.
// Rows past the split's end: scores masked, their scales taken as 0, their V codes zeroed (a NaN
// code times P = 0 is still NaN). Rows past the request's: Q zero, never stored.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/attention/cuda/prefill_common.cuh"
#include "kernels/attention/cuda/prefill_wgmma.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/tensor_map.cuh"
#include "kernels/mla/mla_cuda_internal.cuh"
#include "kernels/mla/mla_rows16.cuh"
#include "kernels/mla/mla_tma.cuh"
#include "kernels/mla/mla_wgmma.cuh"

namespace tandem::kernels::cuda::mla_internal {
// Not an anonymous namespace (see mla_decode_tma.cu: the compute_90 pass empties the kernel).
namespace rows16_fp8_kernel {

using rows16_common::ClusterMergeRows;
using rows16_common::kClusterBytes;
using rows16_common::kD;
using rows16_common::kKeys;
using rows16_common::kQPitch;
using rows16_common::kRows;
using rows16_common::kThreads;
using rows16_common::kWarps;
using rows16_common::MaskAndShareMax;
using rows16_common::SoftmaxToP;
using rows16_common::StageQ;
using rows16_common::StoreRows;
using wgmma_common::BarSync;

inline constexpr int kChunks = kD / 64;        // 9 chunks of 64 codes
inline constexpr int kTileBytes = kKeys * kD;  // one stage's codes: [64 rows][9 chunks][64]
inline constexpr int kStages = 4;
inline constexpr int kScaleOff = kStages * kTileBytes;         // [stages][64] row scales
inline constexpr int kPOff = kScaleOff + kStages * kKeys * 4;  // P: [16 rows][128 bytes] fp16
inline constexpr int kRedOff = kPOff + kRows * 128;  // [8 warps][16 rows] float: maxima, sums
inline constexpr int kQExpOff = kRedOff + kWarps * kRows * 4;    // [16 rows] Q's exponents
inline constexpr int kBarOff = kQExpOff + kRows * 4;             // full barriers [stages]
inline constexpr int kSmemBytes = kBarOff + kStages * 8 + 1024;  // + alignment slack
static_assert(kSmemBytes <= 227 * 1024, "over the opt-in shared memory limit");
static_assert(internal::MergeSmemFloats(kRows, 256) * 4 <= kTileBytes,
              "the merge's weights of 256 splits fit in a latent stage");
static_assert(kClusterBytes <= kStages * kTileBytes,
              "the cluster merge's partial and scratch fit in the latent stages");
static_assert(kRows * kQPitch <= kTileBytes, "Q fits in a latent stage");
inline constexpr int kIssueWarp = 0;

// Where the pool's codes and scales are: a box is (block, row in block = layer x page + slot).
struct Fp8Geometry {
  int layer_row;  // layer * block_size
  int box_rows;   // min(block_size, 64)
};
struct BoxAt {
  int block, row;
};

// One box of the 4-D codes map (64 codes x 9 chunks x box rows x 1 block) at (row, block).
__device__ __forceinline__ void TmaLoadBox(uint32_t dst, const CUtensorMap* map, int row, int block,
                                           uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(0), "r"(row), "r"(block), "r"(bar)
      : "memory");
}

// The byte offset of 16-byte unit u of chunk ch of token row tok in a stage ([64 rows][9 chunks]
// [64 codes], the copy engine's 64-byte swizzle over the 64-byte lines).
__device__ __forceinline__ int CodeOffset(int tok, int ch, int u) {
  const int line = tok * kChunks + ch;
  return line * 64 + ((u ^ ((line >> 1) & 3)) * 16);
}
__device__ __forceinline__ void BulkLoad(uint32_t dst, const void* src, uint32_t bytes,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(bar)
      : "memory");
}

// Box `box` of the tile starting at latent key0 (one box per lane; a box past ke repeats the last
// valid box, whose rows past ke are masked, scaled 0 and zeroed before P V).
template <typename T>
__device__ __forceinline__ BoxAt BoxOf(const LatentParams<T>& p, const Fp8Geometry& g,
                                       const int32_t* table, int key0, int box, int ke) {
  int key = key0 + box * g.box_rows;
  if (key >= ke) key = (ke - 1) / g.box_rows * g.box_rows;
  return {table[key / p.block_size], g.layer_row + key % p.block_size};
}

// One warp: the whole tile whose box lane l < boxes holds (at) into the stage at smem address dst
// (its scales at sdst) on the stage's barrier bar. Lane 0 arms it, then each box's lane issues its
// box (one copy: every chunk of its rows) and its scales.
template <typename T>
__device__ __forceinline__ void IssueTile(const LatentParams<T>& p, const CUtensorMap* map,
                                          const Fp8Geometry& g, const BoxAt& at, int boxes,
                                          uint32_t dst, uint32_t sdst, uint32_t bar, int lane) {
  if (lane == 0) tma_kernel::MbarExpectTx(bar, kTileBytes + kKeys * 4);
  __syncwarp();
  if (lane < boxes) {
    const uint32_t off = lane * g.box_rows;
    TmaLoadBox(dst + off * kD, map, at.row, at.block, bar);
    BulkLoad(sdst + off * 4, p.row_scales + at.block * p.scale_block_stride + at.row,
             g.box_rows * 4, bar);
  }
}

// Q's rows to fp16 A fragments: row r's factor 2^(14 - e) (max|row| < 2^e; 1 for a zero or
// non-finite maximum), e at qexp[r]; the thread's rows lane / 4 and + 8, chunk c, step j:
// {row lo dims 16 t4 + 4 j + {0, 1}, row hi same, row lo + {2, 3}, row hi + {2, 3}} of the chunk.
template <typename T>
__device__ __forceinline__ void QRowExponents(const uint8_t* sq, int* qexp, int warp, int lane) {
  for (int r = warp; r < kRows; r += kWarps) {
    float mx = 0.0f;
    for (int u = lane; u < kD / 8; u += 32) {
      const uint4 x = *reinterpret_cast<const uint4*>(sq + r * kQPitch + u * 16);
      const T* v = reinterpret_cast<const T*>(&x);
#pragma unroll
      for (int i = 0; i < 8; ++i) mx = fmaxf(mx, fabsf(static_cast<float>(v[i])));
    }
#pragma unroll
    for (int x = 16; x > 0; x >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
    if (lane == 0) {
      int e = 14;  // factor 1
      if (mx > 0.0f && mx <= 3.0e38f) {
        frexpf(mx, &e);  // mx < 2^e
        e = max(min(e, 100), -100);
      }
      qexp[r] = e;
    }
  }
}

template <typename T>
__device__ __forceinline__ void LoadQFragsF16(const uint8_t* sq, const int* qexp, int lane,
                                              uint32_t (&qa)[kChunks][4][4], float (&qm)[2]) {
  const int g = lane / 4, t4 = lane % 4;
  float f[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int e = qexp[g + 8 * h];
    f[h] = ldexpf(1.0f, 14 - e);
    qm[h] = ldexpf(1.0f, e - 14);
  }
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint8_t* src = sq + (g + 8 * h) * kQPitch + (c * 64 + 16 * t4) * 2;
      uint4 x[2];
      x[0] = *reinterpret_cast<const uint4*>(src);
      x[1] = *reinterpret_cast<const uint4*>(src + 16);
      const T* v = reinterpret_cast<const T*>(x);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const __half2 pr = __floats2half2_rn(static_cast<float>(v[4 * j + 2 * half]) * f[h],
                                               static_cast<float>(v[4 * j + 2 * half + 1]) * f[h]);
          qa[c][j][2 * half + h] = *reinterpret_cast<const uint32_t*>(&pr);
        }
      }
    }
  }
}

// Two e4m3 codes (low byte first) as an fp16 pair, exactly.
__device__ __forceinline__ uint32_t CodesToHalf2(uint32_t two) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// Warp w's raw scores of tokens [8 w, 8 w + 8) (s = {row lo, tokens 2 t4 + 0 / 1; row hi, same}),
// chunk by chunk as the chunks land: a lane's token 8 w + lane / 4, its 16 codes 16 t4 .. + 15 of
// each chunk in one shared load.
__device__ __forceinline__ void TileScores(float (&s)[4], const uint32_t (&qa)[kChunks][4][4],
                                           const uint8_t* stage, uint64_t* bar, uint32_t parity,
                                           int warp, int lane) {
  float acc[2][4];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i / 4][i % 4] = 0.0f;
  const int tok = warp * 8 + lane / 4;
  internal::MbarWaitOrTrap(bar, parity);  // a protocol bug traps, never hangs
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const uint4 k = *reinterpret_cast<const uint4*>(stage + CodeOffset(tok, c, lane % 4));
    const uint32_t w[4] = {k.x, k.y, k.z, k.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      Mma16816<__half>(acc[j % 2], qa[c][j], CodesToHalf2(w[j]), CodesToHalf2(w[j] >> 16));
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) s[i] = acc[0][i] + acc[1][i];
}

// O[16][64 w ..) = alpha O + P V: P (fp16) from shared memory, V = chunk w of the stage's codes.
// ldmatrix.trans of code pairs gives a lane {token 2 t4: dims 2 g, 2 g + 1; token 2 t4 + 1: the
// same}; a byte permute makes the even dim's pair and the odd dim's pair of the two tokens.
__device__ __forceinline__ void AddPv(float (&o)[32], const float (&alpha)[2], uint32_t p_addr,
                                      uint32_t stage, int warp, int lane) {
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i] *= alpha[(i % 4) / 2];
  const int mi = lane / 8;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t a[4];
    const int pr = lane % 16, pu = kk * 2 + lane / 16;
    LdMatrixX4(p_addr + pr * 128 + ((pu ^ (pr % 8)) * 16), a);
    const int tok = kk * 16 + lane % 8 + 8 * (mi % 2);
#pragma unroll
    for (int db = 0; db < 2; ++db) {
      const int unit = 2 * db + mi / 2;
      uint32_t m[4];  // tokens 0-7 / 8-15 of the step x units 2 db / 2 db + 1
      LdMatrixX4Trans(stage + CodeOffset(tok, warp, unit), m);
#pragma unroll
      for (int uu = 0; uu < 2; ++uu) {
        const uint32_t lo = __byte_perm(m[2 * uu], 0, 0x3120);
        const uint32_t hi = __byte_perm(m[2 * uu + 1], 0, 0x3120);
        float* ou = o + 8 * (2 * db + uu);
        Mma16816<__half>(ou, a, CodesToHalf2(lo), CodesToHalf2(hi));
        Mma16816<__half>(ou + 4, a, CodesToHalf2(lo >> 16), CodesToHalf2(hi >> 16));
      }
    }
  }
}

// Zeroes the codes of token rows [valid, 64) of chunk `chunk` (one warp; generic writes, fenced
// for the TMA that later refills the stage).
__device__ __forceinline__ void ZeroTailChunk(uint8_t* stage, int valid, int chunk, int lane) {
  for (int i = lane; i < (kKeys - valid) * 4; i += 32) {
    *reinterpret_cast<uint4*>(stage + CodeOffset(valid + i / 4, chunk, i % 4)) =
        make_uint4(0, 0, 0, 0);
  }
  internal::prefill::FenceProxyAsync();
  __syncwarp();
}

// The issuing warp's prologue: the barriers, the box rows of tiles 0 .. kStages into rows, tiles
// 0 .. kStages - 2 (the last stage holds Q until every warp has its fragments). kPrewait: those
// tiles wholly below the latents this step writes before griddepcontrol.wait, the rest after.
template <typename T, bool kPrewait>
__device__ __forceinline__ void IssuePrologue(const LatentParams<T>& p, const LatentCta& c,
                                              const CUtensorMap* map, const Fp8Geometry& g,
                                              uint64_t* full, uint32_t base, uint32_t bar_addr,
                                              int num_tiles, int boxes, int lane,
                                              BoxAt (&rows)[kStages + 1]) {
  if (lane == 0) {
    for (int i = 0; i < kStages; ++i) internal::prefill::MbarInit(full + i, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
#pragma unroll
  for (int t = 0; t <= kStages; ++t) {
    rows[t] = t < num_tiles && lane < boxes ? BoxOf(p, g, c.table, c.kb + t * kKeys, lane, c.ke)
                                            : BoxAt{0, 0};
  }
  __syncwarp();
  const uint32_t sbase = base + kScaleOff;
  int pre = 0;
  if constexpr (kPrewait) {
    const int pre_end = LocalKeyEnd(p, c.ctx - c.q_len);
    while (pre < kStages - 1 && pre < num_tiles && c.kb + (pre + 1) * kKeys <= pre_end) ++pre;
#pragma unroll
    for (int t = 0; t < kStages - 1; ++t) {
      if (t < pre) {
        IssueTile(p, map, g, rows[t], boxes, base + t * kTileBytes, sbase + t * kKeys * 4,
                  bar_addr + t * 8, lane);
      }
    }
    internal::WaitForPrecedingGrid();
  }
#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) {
    if (t >= pre && t < num_tiles) {
      IssueTile(p, map, g, rows[t], boxes, base + t * kTileBytes, sbase + t * kKeys * 4,
                bar_addr + t * 8, lane);
    }
  }
}

// The tile's row scales of this lane's two tokens (ks, 0 past ke) and the tile's largest (s_t,
// the same in every warp).
__device__ __forceinline__ void TileScales(const float* sc, int key0, int ke, int warp, int lane,
                                           float (&ks)[2], float& s_t) {
  const float2 mine = *reinterpret_cast<const float2*>(sc + warp * 8 + 2 * (lane % 4));
  const int k0 = key0 + warp * 8 + 2 * (lane % 4);
  ks[0] = k0 < ke ? mine.x : 0.0f;
  ks[1] = k0 + 1 < ke ? mine.y : 0.0f;
  const float2 all = *reinterpret_cast<const float2*>(sc + 2 * lane);
  float m = fmaxf(key0 + 2 * lane < ke ? all.x : 0.0f, key0 + 2 * lane + 1 < ke ? all.y : 0.0f);
#pragma unroll
  for (int x = 16; x > 0; x >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, x));
  s_t = m;
}

// kPrewait / kCluster: as MlaRows16Kernel (mla_decode_rows16.cu). No phase-stamp variant.
template <typename T, bool kPrewait, bool kCluster>
__global__ void __launch_bounds__(kThreads, 1)
    MlaRows16Fp8Kernel(const __grid_constant__ LatentParams<T> p,
                       const __grid_constant__ CUtensorMap map, const Fp8Geometry g) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  float* red = reinterpret_cast<float*>(smem + kRedOff);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBarOff);
  const float* scales = reinterpret_cast<const float*>(smem + kScaleOff);

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  if constexpr (kPrewait) internal::AllowDependentLaunch();
  if (tid == kIssueWarp * 32) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map)) : "memory");
  }
  const LatentCta c = LatentCtaOf(p, kRows);
  const bool merge = !kCluster && p.merge_counters != nullptr;
  if (kPrewait && !kCluster && !merge) internal::WaitForPrecedingGrid();  // EmptySplitDone stores
  const int filled = merge ? c.Filled() : 0;
  if (c.r0 >= c.rows_seq ||
      (!kCluster && (merge ? blockIdx.x >= filled : EmptySplitDone(p, c, kRows)))) {
    return;
  }
  const int kb = c.kb, ke = c.ke, num_tiles = c.Tiles(kKeys), boxes = kKeys / g.box_rows;
  const uint32_t base = SmemAddr(smem), bar_addr = SmemAddr(full), sbase = base + kScaleOff;

  BoxAt rows[kStages + 1] = {};
  if (warp == kIssueWarp) {
    IssuePrologue<T, kPrewait>(p, c, &map, g, full, base, bar_addr, num_tiles, boxes, lane, rows);
  } else if constexpr (kPrewait) {
    internal::WaitForPrecedingGrid();  // Q (q_cat) is the preceding kernel's output
  }
  constexpr int kQStage = kStages - 1;  // Q's buffer until tile kStages - 1 is issued
  uint8_t* sq = smem + kQStage * kTileBytes;
  int* qexp = reinterpret_cast<int*>(smem + kQExpOff);
  StageQ(p, c, sq, tid);
  __syncthreads();  // Q staged; the barriers initialized
  QRowExponents<T>(sq, qexp, warp, lane);
  __syncthreads();
  uint32_t qa[kChunks][4][4];
  float qm[2];
  LoadQFragsF16<T>(sq, qexp, lane, qa, qm);
  internal::prefill::FenceProxyAsync();  // the stage's generic accesses before the TMA's writes
  __syncthreads();                       // every warp has read Q: its stage may be overwritten
  if (warp == kIssueWarp && kQStage < num_tiles) {
    IssueTile(p, &map, g, rows[kQStage], boxes, base + kQStage * kTileBytes,
              sbase + kQStage * kKeys * 4, bar_addr + kQStage * 8, lane);
  }
  BoxAt next_rows = rows[kStages];

  const int vis[2] = {c.KeyEnd(p, lane / 4), c.KeyEnd(p, lane / 4 + 8)};
  float o[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  float s_run = 0.0f;  // O's unit: the running tile scale (0 until a tile has one)

  for (int t = 0; t < num_tiles; ++t) {
    const int st = t % kStages;
    const int key0 = kb + t * kKeys;
    float s[4];
    TileScores(s, qa, smem + st * kTileBytes, full + st, (t / kStages) & 1, warp, lane);
    float ks[2], s_t;
    TileScales(scales + st * kKeys, key0, ke, warp, lane, ks, s_t);
#pragma unroll
    for (int i = 0; i < 4; ++i) s[i] *= qm[i / 2] * ks[i % 2];
    MaskAndShareMax(s, key0, warp, lane, vis, p.scale_log2, red);
    BarSync(1, kThreads);  // A: every warp's maxima; P V of tile t - 1 done everywhere
    if (warp == kIssueWarp && t >= 1 && t + kStages - 1 < num_tiles) {  // into t - 1's stage
      const int s2 = (t + kStages - 1) % kStages;
      IssueTile(p, &map, g, next_rows, boxes, base + s2 * kTileBytes, sbase + s2 * kKeys * 4,
                bar_addr + s2 * 8, lane);
      if (t + kStages < num_tiles && lane < boxes) {
        next_rows = BoxOf(p, g, c.table, kb + (t + kStages) * kKeys, lane, ke);
      }
    }
    // P's factors ks / S_t in [0, 1]; O moves from the unit s_run to S_t (a tile without scales
    // keeps the unit: its P is 0).
    const float inv_t = s_t > 0.0f ? 1.0f / s_t : 0.0f;
    const float ratio = s_t > 0.0f && s_run > 0.0f ? s_run / s_t : 1.0f;
    if (s_t > 0.0f) s_run = s_t;
    const float pk[2] = {ks[0] * inv_t, ks[1] * inv_t};
    float alpha[2];
    SoftmaxToP<__half, true>(s, red, warp, lane, m_run, l_run, alpha, smem + kPOff, pk);
    alpha[0] *= ratio;
    alpha[1] *= ratio;
    if (ke - key0 < kKeys) ZeroTailChunk(smem + st * kTileBytes, ke - key0, warp, lane);
    BarSync(2, kThreads);  // B: P complete
    AddPv(o, alpha, base + kPOff, base + st * kTileBytes, warp, lane);
  }

  if constexpr (kCluster) {
    StoreRows<T, true, true>(p, c, red, warp, lane, o, l_run, m_run, false,
                             reinterpret_cast<float*>(smem), s_run);
    ClusterMergeRows(p, c, smem, nullptr);
    return;
  }
  const bool direct = merge ? filled == 1 : p.num_splits == 1;
  StoreRows<T, false, true>(p, c, red, warp, lane, o, l_run, m_run, direct, nullptr, s_run);
  if (merge && filled > 1) tma_kernel::MergeInKernel<kRows>(p, c, filled, smem, nullptr);
#endif
}

}  // namespace rows16_fp8_kernel

namespace {
template <typename T, bool kCluster>
auto Rows16Fp8Kernel(bool prewait) {
  using rows16_fp8_kernel::MlaRows16Fp8Kernel;
  return prewait ? MlaRows16Fp8Kernel<T, true, kCluster> : MlaRows16Fp8Kernel<T, false, kCluster>;
}

// The codes of an FP8 latent pool as [blocks][rows_per_block][9 chunks][64] bytes, a box = 64
// codes x 9 chunks x box_rows rows (one copy a page run), 64-byte swizzle.
absl::StatusOr<CUtensorMap> EncodeFp8CodesMap(const DeviceKvCache& cache, int box_rows,
                                              int64_t rows_per_block, int64_t block_stride) {
  using rows16_fp8_kernel::kChunks;
  const cuuint64_t dims[4] = {64, static_cast<cuuint64_t>(kChunks),
                              static_cast<cuuint64_t>(rows_per_block),
                              static_cast<cuuint64_t>(cache.layout.num_blocks)};
  const cuuint64_t strides[3] = {64, static_cast<cuuint64_t>(rows16_common::kD),
                                 static_cast<cuuint64_t>(block_stride)};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(kChunks),
                             static_cast<cuuint32_t>(box_rows), 1};
  return tma_kernel::EncodeLatentMap(cache.data, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, dims, strides,
                                     box, CU_TENSOR_MAP_SWIZZLE_64B, "FP8 latent codes");
}
}  // namespace

template <typename T>
bool MlaRows16Fp8Fits(const LatentParams<T>& p, const DeviceKvCache& cache) {
  const int64_t bs = cache.layout.block_size;
  const int64_t box_rows = bs < 64 ? bs : 64;
  const int64_t rows_per_block = cache.layout.num_layers * bs;
  return MlaTmaFits(cache) && box_rows % 8 == 0 && p.code_block_stride % 16 == 0 &&
         (p.scale_block_stride * 4) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.row_scales) % 16 == 0 &&
         cache.layout.num_blocks * rows_per_block < (int64_t{1} << 31);
}

template <typename T>
absl::Status LaunchMlaRows16Fp8(const LatentParams<T>& p, const DeviceKvCache& cache, int64_t layer,
                                dim3 grid, bool prewait, bool cluster, cudaStream_t stream) {
  using rows16_fp8_kernel::kSmemBytes;
  const int64_t bs = cache.layout.block_size;
  const rows16_fp8_kernel::Fp8Geometry g{static_cast<int>(layer * bs),
                                         static_cast<int>(bs < 64 ? bs : 64)};
  ASSIGN_OR_RETURN(
      const CUtensorMap map,
      EncodeFp8CodesMap(cache, g.box_rows, cache.layout.num_layers * bs, p.code_block_stride));
  return cluster ? rows16_common::LaunchRows16(Rows16Fp8Kernel<T, true>(prewait), grid, kSmemBytes,
                                               true, prewait, stream, p, map, g)
                 : rows16_common::LaunchRows16(Rows16Fp8Kernel<T, false>(prewait), grid, kSmemBytes,
                                               false, prewait, stream, p, map, g);
}

template bool MlaRows16Fp8Fits<__nv_bfloat16>(const LatentParams<__nv_bfloat16>&,
                                              const DeviceKvCache&);
template bool MlaRows16Fp8Fits<__half>(const LatentParams<__half>&, const DeviceKvCache&);
template absl::Status LaunchMlaRows16Fp8<__nv_bfloat16>(const LatentParams<__nv_bfloat16>&,
                                                        const DeviceKvCache&, int64_t, dim3, bool,
                                                        bool, cudaStream_t);
template absl::Status LaunchMlaRows16Fp8<__half>(const LatentParams<__half>&, const DeviceKvCache&,
                                                 int64_t, dim3, bool, bool, cudaStream_t);

}  // namespace tandem::kernels::cuda::mla_internal
