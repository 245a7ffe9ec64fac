// Tensor-core flash-decoding kernel behind cuda::PagedAttention for bf16/fp16/fp8 KV with
// head_dim 64/128 (internal; included by paged_attention_cuda.cu only).
//
// CTA = 4 warps = (request, kv head, row tile of up to 16 query rows, KV split), like the CUDA-
// core kernel in paged_decode_kernel.cuh, but scores and P.V run on mma.sync m16n8k16: the
// rows (token x group head, zero-padded to 16) are the A operand, K and V go from shared memory
// to B fragments with ldmatrix (.trans for V) without any conversion to fp32, so the kernel
// issues a few instructions per 16-byte unit of KV and stays memory-bound. K/V tiles of 64 keys
// stream through a cp.async ring; shared-memory rows are XOR-swizzled in 16-byte units
// (unit ^ (key & 7)) so ldmatrix's 8-row reads hit 8 distinct bank groups. Each warp owns 16
// keys of every tile with its own online softmax (fp32, log2 domain); P is rounded to T for the
// P.V product (as FlashAttention does) while l sums the fp32 weights. Warps merge at the end
// through shared memory. fp8 KV: tiles land in the ring as fp8 and are widened to fp16 in a
// second shared buffer (one hardware cvt per pair) before the same ldmatrix/mma path; the MMA
// then runs in fp16, with the K scale folded into q and the V scale into the output.
#ifndef TANDEM_KERNELS_CUDA_PAGED_DECODE_TC_KERNEL_CUH_
#define TANDEM_KERNELS_CUDA_PAGED_DECODE_TC_KERNEL_CUH_

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/paged_decode_kernel.cuh"

namespace tandem::kernels::cuda::internal {

template <int D, int kKvBytes>
struct TcCfg {
  static constexpr int kT = 64;  // keys per tile: 16 per warp
  static constexpr int kStages = D <= 64 ? 4 : 3;
  static constexpr int kRowUnits = D * 2 / 16;               // 16-byte units per 2-byte row
  static constexpr int kKvRowUnits = D * kKvBytes / 16;      // 16-byte units per stored row
  static constexpr int kStageBytes = 2 * kT * D * kKvBytes;  // K + V as stored
  static constexpr int kConvBytes = kKvBytes == 1 ? 2 * kT * D * 2 : 0;  // fp8 widened to fp16
  static constexpr int kSmemBytes = kStages * kStageBytes + kConvBytes;
  static constexpr int kCopies = kT * kKvRowUnits / kDecodeThreads;  // per thread, K (and V)
  static constexpr int kCtasPerSm =
      (227 * 1024) / (kSmemBytes + 1024) < 4 ? (227 * 1024) / (kSmemBytes + 1024) : 4;
  static constexpr int kRows = 16;
  static_assert(4 * (kRows * (D + 2)) * 4 <= kSmemBytes);
};

__device__ __forceinline__ void LdMatrixX4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a (16x16, row) * b (16x8, col), fp32 accumulators.
template <typename T>
__device__ __forceinline__ void Mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <typename T>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi) {
  Vec<T, 2> v;
  v.v[0] = FromFloat<T>(lo);
  v.v[1] = FromFloat<T>(hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

template <typename T, typename KV, int D>
__global__ void __launch_bounds__(kDecodeThreads, TcCfg<D, sizeof(KV)>::kCtasPerSm)
    PagedDecodeTcKernel(const __grid_constant__ DecodeParams<T> p) {
  using C = TcCfg<D, sizeof(KV)>;
  constexpr bool kFp8 = sizeof(KV) == 1;
  using M = std::conditional_t<kFp8, __half, T>;  // MMA operand type
  constexpr int kT = C::kT, kRU = C::kRowUnits, kKs = D / 16;
  extern __shared__ uint4 smem_u4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_u4);

  const int split = blockIdx.x;
  const int kvh = blockIdx.y % p.num_kv_heads;
  const int row_tile = blockIdx.y / p.num_kv_heads;
  const int seq = blockIdx.z;
  const int q_start = p.query_start_loc[seq];
  const int q_len = p.query_start_loc[seq + 1] - q_start;
  const int seq_len = p.seq_lens[seq];
  const int rows_total = q_len * p.group;
  const int row0 = row_tile * C::kRows;
  if (row0 >= rows_total) return;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  const int first_pos = seq_len - q_len;
  const int rows_here = min(C::kRows, rows_total - row0);
  const int tok_first = row0 / p.group;
  const int tok_last = (row0 + rows_here - 1) / p.group;
  const int lo_cta = p.window_left >= 0 ? max(0, first_pos + tok_first - p.window_left) : 0;
  const int hi_cta = first_pos + tok_last + 1;
  const int span = hi_cta - lo_cta;
  const int chunk = ((span + p.num_splits - 1) / p.num_splits + kT - 1) / kT * kT;
  const int k_begin = lo_cta + split * chunk;
  const int k_end = min(hi_cta, k_begin + chunk);
  const int n_tiles = k_end > k_begin ? (k_end - k_begin + kT - 1) / kT : 0;

  // This thread's two rows (g, g + 8): visible keys and q as A fragments.
  int lo[2], hi[2];
  const T* q_row[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int rr = g + 8 * j;
    const bool valid = rr < rows_here;
    const int gr = row0 + rr;
    const int tok = valid ? gr / p.group : 0;
    const int pos = first_pos + tok;
    lo[j] = valid ? max(k_begin, p.window_left >= 0 ? max(0, pos - p.window_left) : 0) : 0;
    hi[j] = valid ? min(k_end, pos + 1) : 0;
    q_row[j] =
        valid ? p.q + (int64_t{q_start + tok} * p.num_q_heads + kvh * p.group + gr % p.group) * D
              : nullptr;
  }
  float k_deq = 1.0f, v_deq = 1.0f;
  if constexpr (kFp8) {
    k_deq = p.k_scale[p.per_head_scale ? kvh : 0];
    v_deq = p.v_scale[p.per_head_scale ? kvh : 0];
  }
  uint32_t qa[kKs][4];
#pragma unroll
  for (int ks = 0; ks < kKs; ++ks) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const T* row = q_row[r & 1];
      qa[ks][r] = 0u;
      if (row == nullptr) continue;
      const T* src = row + ks * 16 + t4 * 2 + 8 * (r >> 1);
      if constexpr (kFp8) {  // q x k_scale, as fp16 for the fp16 MMA
        qa[ks][r] = PackPair<M>(ToFloat(src[0]) * k_deq, ToFloat(src[1]) * k_deq);
      } else {
        qa[ks][r] = *reinterpret_cast<const uint32_t*>(src);
      }
    }
  }

  const KV* pool = static_cast<const KV*>(p.pool) + p.layer_offset + int64_t{kvh} * D;
  const int32_t* table = p.block_tables + int64_t{seq} * p.max_blocks_per_seq;
  auto load_tile = [&](int t) {
    uint8_t* ks = smem + (t % C::kStages) * C::kStageBytes;
    uint8_t* vs = ks + C::kStageBytes / 2;
    const int tile_start = k_begin + t * kT;
#pragma unroll
    for (int j = 0; j < C::kCopies; ++j) {
      const int c = tid + j * kDecodeThreads;
      const int key = c / C::kKvRowUnits;
      const int unit = c % C::kKvRowUnits;
      const int pos = tile_start + key;
      const KV* src = pool;
      int bytes = 0;
      if (pos < k_end) {
        const int blk = p.block_shift >= 0 ? pos >> p.block_shift : pos / p.block_size;
        const int off = pos - blk * p.block_size;
        src = pool + int64_t{table[blk]} * p.block_elems + int64_t{off} * p.token_stride +
              unit * (16 / static_cast<int>(sizeof(KV)));
        bytes = 16;
      }
      // 2-byte tiles are read by ldmatrix: swizzle. fp8 tiles are read linearly by the widening.
      const int dst = kFp8 ? c * 16 : (key * kRU + (unit ^ (key & 7))) * 16;
      CpAsync16(ks + dst, src, bytes);
      CpAsync16(vs + dst, src + (bytes ? p.tile_elems : 0), bytes);
    }
  };

  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int key0 = warp * 16;
  const int mi = lane >> 3, mr = lane & 7;

#pragma unroll
  for (int t = 0; t < C::kStages - 1; ++t) {
    if (t < n_tiles) load_tile(t);
    CpAsyncCommit();
  }
  for (int t = 0; t < n_tiles; ++t) {
    CpAsyncWait<C::kStages - 2>();
    __syncthreads();
    if (t + C::kStages - 1 < n_tiles) load_tile(t + C::kStages - 1);
    CpAsyncCommit();
    uint8_t* tile = smem + (t % C::kStages) * C::kStageBytes;
    if constexpr (kFp8) {
      // Widen this tile to fp16 in the conversion buffer, in the swizzled 2-byte layout. The
      // barrier at the top of the next iteration keeps the buffer until every warp is done.
      uint8_t* conv = smem + C::kStages * C::kStageBytes;
#pragma unroll
      for (int j = 0; j < 2 * C::kCopies; ++j) {
        const int c = tid + j * kDecodeThreads;  // fp8 unit: K units first, then V units
        const int kv = c / (kT * C::kKvRowUnits);
        const int key = (c % (kT * C::kKvRowUnits)) / C::kKvRowUnits;
        const int unit = c % C::kKvRowUnits;
        // e4m3 -> fp16 is exact and one hardware cvt per pair: no detour through fp32.
        const uint4 raw = *reinterpret_cast<const uint4*>(tile + c * 16);
        const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
        uint8_t* dst = conv + kv * (C::kConvBytes / 2);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint4 wide;
          uint32_t* w = reinterpret_cast<uint32_t*>(&wide);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const uint32_t word = words[2 * h + i / 2];
            const __half2_raw pair = __nv_cvt_fp8x2_to_halfraw2(
                static_cast<__nv_fp8x2_storage_t>(i % 2 == 0 ? word & 0xffffu : word >> 16),
                __NV_E4M3);
            w[i] = static_cast<uint32_t>(pair.x) | (static_cast<uint32_t>(pair.y) << 16);
          }
          const int hu = 2 * unit + h;
          *reinterpret_cast<uint4*>(dst + (key * kRU + (hu ^ (key & 7))) * 16) = wide;
        }
      }
      __syncthreads();
      tile = conv;
    }
    const uint32_t kbase = static_cast<uint32_t>(__cvta_generic_to_shared(tile));
    const uint32_t vbase = kbase + (kFp8 ? C::kConvBytes : C::kStageBytes) / 2;
    const int tile_start = k_begin + t * kT;
    if (tile_start + key0 >= k_end) continue;  // this warp's 16 keys are all beyond the split

    float s[2][4] = {};
    {
      const int key = key0 + (mi >> 1) * 8 + mr;
#pragma unroll
      for (int ks = 0; ks < kKs; ++ks) {
        uint32_t b[4];
        LdMatrixX4(kbase + (key * kRU + ((ks * 2 + (mi & 1)) ^ (key & 7))) * 16, b);
        Mma16816<M>(s[0], qa[ks], b[0], b[1]);
        Mma16816<M>(s[1], qa[ks], b[2], b[3]);
      }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = e >> 1;
        const int pos = tile_start + key0 + nt * 8 + t4 * 2 + (e & 1);
        float v = s[nt][e];
        v = p.softcap_log2 > 0.0f ? p.softcap_log2 * tanhf(v * p.q_scale * p.inv_softcap)
                                  : v * p.q_scale;
        if (pos < lo[j] || pos >= hi[j]) v = -INFINITY;
        s[nt][e] = v;
        mx[j] = fmaxf(mx[j], v);
      }
    }
    float m_use[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 1));
      mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 2));
      const float m_new = fmaxf(m[j], mx[j]);
      m_use[j] = m_new == -INFINITY ? 0.0f : m_new;
      const float c = exp2f(m[j] - m_use[j]);
      l[j] *= c;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        o[n][2 * j] *= c;
        o[n][2 * j + 1] *= c;
      }
      m[j] = m_new;
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2f(s[nt][e] - m_use[e >> 1]);
        l[e >> 1] += s[nt][e];
      }
    }
    const uint32_t pa[4] = {PackPair<M>(s[0][0], s[0][1]), PackPair<M>(s[0][2], s[0][3]),
                            PackPair<M>(s[1][0], s[1][1]), PackPair<M>(s[1][2], s[1][3])};
    {
      const int key = key0 + (mi & 1) * 8 + mr;
#pragma unroll
      for (int dt = 0; dt < kKs; ++dt) {
        uint32_t b[4];
        LdMatrixX4Trans(vbase + (key * kRU + ((dt * 2 + (mi >> 1)) ^ (key & 7))) * 16, b);
        Mma16816<M>(o[2 * dt], pa, b[0], b[1]);
        Mma16816<M>(o[2 * dt + 1], pa, b[2], b[3]);
      }
    }
  }
  CpAsyncWait<0>();
  __syncthreads();  // ring free: reuse it for the warp merge

  // Row sums live spread over the 4 lanes of a row.
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    l[j] += __shfl_xor_sync(0xffffffffu, l[j], 1);
    l[j] += __shfl_xor_sync(0xffffffffu, l[j], 2);
  }
  float* red = reinterpret_cast<float*>(smem) + warp * C::kRows * (D + 2);
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e)
      red[(g + 8 * (e >> 1)) * (D + 2) + n * 8 + t4 * 2 + (e & 1)] = o[n][e];
  }
  if (t4 == 0) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      red[(g + 8 * j) * (D + 2) + D] = m[j];
      red[(g + 8 * j) * (D + 2) + D + 1] = l[j];
    }
  }
  __syncthreads();

  const float* base = reinterpret_cast<const float*>(smem);
  for (int idx = tid; idx < rows_here * D; idx += kDecodeThreads) {
    const int rr = idx / D, d = idx % D;
    float mw[4], mstar = -INFINITY;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      mw[w] = base[(w * C::kRows + rr) * (D + 2) + D];
      mstar = fmaxf(mstar, mw[w]);
    }
    const float m_use = mstar == -INFINITY ? 0.0f : mstar;
    float lsum = 0.0f, acc = 0.0f;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float c = exp2f(mw[w] - m_use);
      lsum += c * base[(w * C::kRows + rr) * (D + 2) + D + 1];
      acc += c * base[(w * C::kRows + rr) * (D + 2) + d];
    }
    const int gr = row0 + rr;
    const int64_t row =
        int64_t{q_start + gr / p.group} * p.num_q_heads + kvh * p.group + gr % p.group;
    const bool empty = lsum == 0.0f;  // NaN compares false: propagates
    const float out = empty ? 0.0f : acc * v_deq / lsum;
    const float lse_row = empty ? -INFINITY : (mstar + log2f(lsum)) * kLn2;
    if (p.num_splits == 1) {
      p.out[row * D + d] = FromFloat<T>(out);
      if (p.lse != nullptr && d == 0) p.lse[row] = lse_row;
    } else {
      const int64_t prow = split * p.num_tokens * p.num_q_heads + row;
      p.part_o[prow * D + d] = out;
      if (d == 0) p.part_lse[prow] = lse_row;
    }
  }
}

}  // namespace tandem::kernels::cuda::internal

#endif  // TANDEM_KERNELS_CUDA_PAGED_DECODE_TC_KERNEL_CUH_
