// Layer kernels: 16-byte vectors (8 elements) per thread step, fp32 math, one rounding to T.
#include "absl/strings/str_cat.h"
#include "common/block_reduce.cuh"
#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/layers/cuda/layers_cuda.h"

namespace tandem::kernels::cuda {
namespace {

using internal::FromFloat;
using internal::ToFloat;
using internal::Vec;
using internal::VecToFloat;

constexpr int kVec = 8;
constexpr int kNormThreads = 256;
constexpr int kEltThreads = 256;
using V8 = float[kVec];

template <typename... Args>
absl::Status Invalid(const char* op, const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat("cuda::", op, ": ", args...));
}

bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

unsigned EltBlocks(int64_t work) {
  const int64_t blocks = (work + kEltThreads - 1) / kEltThreads;
  return static_cast<unsigned>(blocks < (int64_t{1} << 30) ? blocks : (int64_t{1} << 30));
}

// One block per token. The row is loaded into registers once (kVecs 16-byte vectors per
// thread, all loads in flight together), reduced, normalized and stored: one read and one write
// of the row (plus the residual store when fused). kVecs = 0 is the fallback for rows wider
// than 8 x 256 x 8 elements: a second pass re-reads the row (from L1/L2).
template <typename T, bool kFusedAdd, int kVecs>
__global__ void __launch_bounds__(kNormThreads)
    RmsNormKernel(const T* x, T* residual, const T* __restrict__ weight, int64_t hidden, float eps,
                  T* out) {
  // PDL (see layers_cuda.h): every tensor is read after the preceding grid completed.
  internal::WaitForPrecedingGrid();
  internal::AllowDependentLaunch();
  __shared__ float warp_sums[kNormThreads / 32];
  const int64_t base = blockIdx.x * hidden;
  const T* src = kFusedAdd ? residual : x;
  constexpr int kHeld = kVecs > 0 ? kVecs : 1;
  float held[kHeld][kVec];
  float sum_sq = 0.0f;
  auto load_row_part = [&](int64_t i, float* a) {
    VecToFloat(*reinterpret_cast<const Vec<T, kVec>*>(src + base + i), a);
    if constexpr (kFusedAdd) {
      V8 b;
      VecToFloat(*reinterpret_cast<const Vec<T, kVec>*>(x + base + i), b);
      Vec<T, kVec> r;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        r.v[j] = FromFloat<T>(a[j] + b[j]);
        a[j] = ToFloat(r.v[j]);  // normalize the rounded residual, as the next layer sees it
      }
      *reinterpret_cast<Vec<T, kVec>*>(residual + base + i) = r;
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) sum_sq = fmaf(a[j], a[j], sum_sq);
  };
  auto store_row_part = [&](int64_t i, const float* a, float inv_rms) {
    V8 w;
    VecToFloat(*reinterpret_cast<const Vec<T, kVec>*>(weight + i), w);
    Vec<T, kVec> o;
#pragma unroll
    for (int j = 0; j < kVec; ++j) o.v[j] = FromFloat<T>((a[j] * inv_rms) * w[j]);
    *reinterpret_cast<Vec<T, kVec>*>(out + base + i) = o;
  };
  if constexpr (kVecs > 0) {
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      const int64_t i = (threadIdx.x + int64_t{v} * kNormThreads) * kVec;
      if (i < hidden) load_row_part(i, held[v]);
    }
    const float inv_rms =
        rsqrtf(BlockSum<kNormThreads>(sum_sq, warp_sums) / static_cast<float>(hidden) + eps);
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      const int64_t i = (threadIdx.x + int64_t{v} * kNormThreads) * kVec;
      if (i < hidden) store_row_part(i, held[v], inv_rms);
    }
  } else {
    for (int64_t i = threadIdx.x * kVec; i < hidden; i += kNormThreads * kVec) {
      load_row_part(i, held[0]);
    }
    const float inv_rms =
        rsqrtf(BlockSum<kNormThreads>(sum_sq, warp_sums) / static_cast<float>(hidden) + eps);
    for (int64_t i = threadIdx.x * kVec; i < hidden; i += kNormThreads * kVec) {
      VecToFloat(*reinterpret_cast<const Vec<T, kVec>*>(src + base + i), held[0]);
      store_row_part(i, held[0], inv_rms);
    }
  }
}

// The one place where hidden becomes the per-thread vector count.
template <typename T, bool kFusedAdd>
cudaError_t LaunchRmsNorm(const T* x, T* residual, const T* weight, int64_t num_tokens,
                          int64_t hidden, float eps, T* out, cudaStream_t stream,
                          bool programmatic_launch) {
  const int64_t vecs = (hidden / kVec + kNormThreads - 1) / kNormThreads;
  const internal::PdlLaunchConfig config(dim3(static_cast<unsigned>(num_tokens)),
                                         dim3(kNormThreads), stream, programmatic_launch);
  auto launch = [&](auto kernel) {
    return cudaLaunchKernelEx(config.get(), kernel, x, residual, weight, hidden, eps, out);
  };
  if (vecs <= 1) return launch(RmsNormKernel<T, kFusedAdd, 1>);
  if (vecs <= 2) return launch(RmsNormKernel<T, kFusedAdd, 2>);
  if (vecs <= 4) return launch(RmsNormKernel<T, kFusedAdd, 4>);
  if (vecs <= 8) return launch(RmsNormKernel<T, kFusedAdd, 8>);
  return launch(RmsNormKernel<T, kFusedAdd, 0>);
}

// Thread = 8 consecutive rotary pairs (i .. i+7, i + half .. i + half + 7) of one head.
template <typename T>
__global__ void __launch_bounds__(kEltThreads)
    RopeKernel(const int64_t* __restrict__ positions, const float* __restrict__ inv_freq,
               int64_t num_tokens, int head_dim, T* q, int num_q_heads, int64_t q_stride, T* k,
               int num_kv_heads, int64_t k_stride) {
  const int half = head_dim / 2;
  const int vecs_per_head = half / kVec;
  const int heads = num_q_heads + num_kv_heads;
  const int64_t total = num_tokens * heads * vecs_per_head;
  for (int64_t idx = blockIdx.x * int64_t{kEltThreads} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * kEltThreads) {
    const int64_t t = idx / (heads * vecs_per_head);
    const int rem = static_cast<int>(idx % (heads * vecs_per_head));
    const int h = rem / vecs_per_head;
    const int i0 = (rem % vecs_per_head) * kVec;
    T* row = h < num_q_heads ? q + t * q_stride + int64_t{h} * head_dim
                             : k + t * k_stride + int64_t{h - num_q_heads} * head_dim;
    const float pos = static_cast<float>(positions[t]);
    V8 x1, x2;
    VecToFloat(*reinterpret_cast<const Vec<T, kVec>*>(row + i0), x1);
    VecToFloat(*reinterpret_cast<const Vec<T, kVec>*>(row + i0 + half), x2);
    Vec<T, kVec> o1, o2;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      float s, c;
      sincosf(pos * inv_freq[i0 + j], &s, &c);
      o1.v[j] = FromFloat<T>(x1[j] * c + (-x2[j]) * s);
      o2.v[j] = FromFloat<T>(x2[j] * c + x1[j] * s);
    }
    *reinterpret_cast<Vec<T, kVec>*>(row + i0) = o1;
    *reinterpret_cast<Vec<T, kVec>*>(row + i0 + half) = o2;
  }
}

template <typename T>
__global__ void __launch_bounds__(kEltThreads)
    SiluAndMulKernel(const T* __restrict__ gate_up, int64_t num_tokens, int64_t inter,
                     T* __restrict__ out) {
  const int64_t vecs = inter / kVec;
  const int64_t total = num_tokens * vecs;
  for (int64_t idx = blockIdx.x * int64_t{kEltThreads} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * kEltThreads) {
    const int64_t t = idx / vecs;
    const int64_t i = (idx % vecs) * kVec;
    V8 g, u;
    VecToFloat(*reinterpret_cast<const Vec<T, kVec>*>(gate_up + t * 2 * inter + i), g);
    VecToFloat(*reinterpret_cast<const Vec<T, kVec>*>(gate_up + t * 2 * inter + inter + i), u);
    Vec<T, kVec> o;
#pragma unroll
    for (int j = 0; j < kVec; ++j) o.v[j] = FromFloat<T>(g[j] / (1.0f + expf(-g[j])) * u[j]);
    *reinterpret_cast<Vec<T, kVec>*>(out + t * inter + i) = o;
  }
}

template <typename T>
__global__ void __launch_bounds__(kEltThreads)
    EmbeddingKernel(const int32_t* __restrict__ ids, int64_t num_tokens,
                    const T* __restrict__ table, int64_t vocab_begin, int64_t vocab, int64_t hidden,
                    T* __restrict__ out, int32_t* bad_id_count) {
  const int64_t vecs = hidden / kVec;
  const int64_t total = num_tokens * vecs;
  for (int64_t idx = blockIdx.x * int64_t{kEltThreads} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * kEltThreads) {
    const int64_t t = idx / vecs;
    const int64_t i = (idx % vecs) * kVec;
    const int64_t id = int64_t{ids[t]} - vocab_begin;  // row in this table
    Vec<T, kVec> v;
    if (id >= 0 && id < vocab) {
      v = *reinterpret_cast<const Vec<T, kVec>*>(table + id * hidden + i);
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) v.v[j] = FromFloat<T>(0.0f);
      if (i == 0 && bad_id_count != nullptr) atomicAdd(bad_id_count, 1);
    }
    *reinterpret_cast<Vec<T, kVec>*>(out + t * hidden + i) = v;
  }
}

}  // namespace

template <typename T>
absl::Status RmsNorm(const T* x, const T* weight, int64_t num_tokens, int64_t hidden, float eps,
                     T* out, cudaStream_t stream, bool programmatic_launch) {
  if (num_tokens < 0 || hidden <= 0 || hidden % kVec != 0 || !(eps >= 0)) {
    return Invalid("RmsNorm",
                   "need num_tokens >= 0, hidden a positive multiple of 8, eps >= 0;"
                   " got ",
                   num_tokens, ", ", hidden, ", ", eps);
  }
  if (num_tokens == 0) return absl::OkStatus();
  if (!Aligned(x) || !Aligned(weight) || !Aligned(out) || x == nullptr || weight == nullptr ||
      out == nullptr) {
    return Invalid("RmsNorm", "x, weight and out must be non-null and 16-byte aligned");
  }
  if (num_tokens > 0x7fffffff) return Invalid("RmsNorm", "too many tokens ", num_tokens);
  CUDA_RETURN_IF_ERROR((LaunchRmsNorm<T, false>(x, nullptr, weight, num_tokens, hidden, eps, out,
                                                stream, programmatic_launch)));
  return absl::OkStatus();
}

template <typename T>
absl::Status FusedAddRmsNorm(T* x, T* residual, const T* weight, int64_t num_tokens, int64_t hidden,
                             float eps, cudaStream_t stream, bool programmatic_launch) {
  if (num_tokens < 0 || hidden <= 0 || hidden % kVec != 0 || !(eps >= 0)) {
    return Invalid("FusedAddRmsNorm",
                   "need num_tokens >= 0, hidden a positive multiple of 8, "
                   "eps >= 0; got ",
                   num_tokens, ", ", hidden, ", ", eps);
  }
  if (num_tokens == 0) return absl::OkStatus();
  if (!Aligned(x) || !Aligned(weight) || !Aligned(residual) || x == nullptr || weight == nullptr ||
      residual == nullptr) {
    return Invalid("FusedAddRmsNorm", "x, residual and weight must be non-null, 16-byte aligned");
  }
  if (num_tokens > 0x7fffffff) return Invalid("FusedAddRmsNorm", "too many tokens ", num_tokens);
  CUDA_RETURN_IF_ERROR((LaunchRmsNorm<T, true>(x, residual, weight, num_tokens, hidden, eps, x,
                                               stream, programmatic_launch)));
  return absl::OkStatus();
}

template <typename T>
absl::Status ApplyRope(const int64_t* positions, int64_t num_tokens, const float* inv_freq,
                       int64_t head_dim, T* q, int64_t num_q_heads, T* k, int64_t num_kv_heads,
                       cudaStream_t stream, int64_t q_token_stride, int64_t k_token_stride) {
  if (num_tokens < 0 || head_dim <= 0 || head_dim % (2 * kVec) != 0 || num_q_heads < 0 ||
      num_kv_heads < 0 || head_dim > (1 << 20) || num_q_heads + num_kv_heads > (1 << 20)) {
    return Invalid("ApplyRope",
                   "need num_tokens >= 0, head_dim a positive multiple of 16, "
                   "heads >= 0; got ",
                   num_tokens, ", ", head_dim, ", ", num_q_heads, ", ", num_kv_heads);
  }
  const int64_t q_stride = q_token_stride < 0 ? num_q_heads * head_dim : q_token_stride;
  const int64_t k_stride = k_token_stride < 0 ? num_kv_heads * head_dim : k_token_stride;
  if (q_stride < num_q_heads * head_dim || k_stride < num_kv_heads * head_dim ||
      q_stride % kVec != 0 || k_stride % kVec != 0) {
    return Invalid("ApplyRope", "token strides must cover a row and be multiples of 8");
  }
  if (num_tokens == 0 || num_q_heads + num_kv_heads == 0) return absl::OkStatus();
  if (positions == nullptr || inv_freq == nullptr || (num_q_heads > 0 && !Aligned(q)) ||
      (num_kv_heads > 0 && !Aligned(k)) || (num_q_heads > 0 && q == nullptr) ||
      (num_kv_heads > 0 && k == nullptr)) {
    return Invalid("ApplyRope", "positions, inv_freq, q and k must be non-null, q/k aligned");
  }
  const int64_t work = num_tokens * (num_q_heads + num_kv_heads) * (head_dim / 2 / kVec);
  RopeKernel<T><<<EltBlocks(work), kEltThreads, 0, stream>>>(
      positions, inv_freq, num_tokens, static_cast<int>(head_dim), q, static_cast<int>(num_q_heads),
      q_stride, k, static_cast<int>(num_kv_heads), k_stride);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T>
absl::Status SiluAndMul(const T* gate_up, int64_t num_tokens, int64_t inter, T* out,
                        cudaStream_t stream) {
  if (num_tokens < 0 || inter <= 0 || inter % kVec != 0) {
    return Invalid("SiluAndMul", "need num_tokens >= 0 and inter a positive multiple of 8; got ",
                   num_tokens, ", ", inter);
  }
  if (num_tokens == 0) return absl::OkStatus();
  if (gate_up == nullptr || out == nullptr || !Aligned(gate_up) || !Aligned(out)) {
    return Invalid("SiluAndMul", "gate_up and out must be non-null and 16-byte aligned");
  }
  SiluAndMulKernel<T><<<EltBlocks(num_tokens * inter / kVec), kEltThreads, 0, stream>>>(
      gate_up, num_tokens, inter, out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T>
absl::Status Embedding(const int32_t* ids, int64_t num_tokens, const T* table, int64_t vocab,
                       int64_t hidden, T* out, cudaStream_t stream, int32_t* bad_id_count) {
  if (num_tokens < 0 || vocab <= 0 || hidden <= 0 || hidden % kVec != 0) {
    return Invalid("Embedding",
                   "need num_tokens >= 0, vocab > 0, hidden a positive multiple of "
                   "8; got ",
                   num_tokens, ", ", vocab, ", ", hidden);
  }
  if (num_tokens == 0) return absl::OkStatus();
  if (ids == nullptr || table == nullptr || out == nullptr || !Aligned(table) || !Aligned(out)) {
    return Invalid("Embedding", "ids, table and out must be non-null, table/out 16-byte aligned");
  }
  EmbeddingKernel<T><<<EltBlocks(num_tokens * hidden / kVec), kEltThreads, 0, stream>>>(
      ids, num_tokens, table, 0, vocab, hidden, out, bad_id_count);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T>
absl::Status VocabShardEmbedding(const int32_t* ids, int64_t num_tokens, const T* table,
                                 int64_t vocab_begin, int64_t rows, int64_t hidden, T* out,
                                 cudaStream_t stream) {
  if (num_tokens < 0 || rows <= 0 || vocab_begin < 0 || hidden <= 0 || hidden % kVec != 0) {
    return Invalid("VocabShardEmbedding",
                   "need num_tokens >= 0, rows > 0, vocab_begin >= 0, hidden a positive multiple "
                   "of 8; got ",
                   num_tokens, ", ", rows, ", ", vocab_begin, ", ", hidden);
  }
  if (num_tokens == 0) return absl::OkStatus();
  if (ids == nullptr || table == nullptr || out == nullptr || !Aligned(table) || !Aligned(out)) {
    return Invalid("VocabShardEmbedding",
                   "ids, table and out must be non-null, table/out 16-byte aligned");
  }
  // Ids outside this rank's rows are another rank's: zero rows, not errors.
  EmbeddingKernel<T><<<EltBlocks(num_tokens * hidden / kVec), kEltThreads, 0, stream>>>(
      ids, num_tokens, table, vocab_begin, rows, hidden, out, nullptr);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

#define TANDEM_LAYERS_CUDA_INSTANTIATE(T)                                                         \
  template absl::Status RmsNorm<T>(const T*, const T*, int64_t, int64_t, float, T*, cudaStream_t, \
                                   bool);                                                         \
  template absl::Status FusedAddRmsNorm<T>(T*, T*, const T*, int64_t, int64_t, float,             \
                                           cudaStream_t, bool);                                   \
  template absl::Status ApplyRope<T>(const int64_t*, int64_t, const float*, int64_t, T*, int64_t, \
                                     T*, int64_t, cudaStream_t, int64_t, int64_t);                \
  template absl::Status SiluAndMul<T>(const T*, int64_t, int64_t, T*, cudaStream_t);              \
  template absl::Status Embedding<T>(const int32_t*, int64_t, const T*, int64_t, int64_t, T*,     \
                                     cudaStream_t, int32_t*);                                     \
  template absl::Status VocabShardEmbedding<T>(const int32_t*, int64_t, const T*, int64_t,        \
                                               int64_t, int64_t, T*, cudaStream_t);
TANDEM_LAYERS_CUDA_INSTANTIATE(__nv_bfloat16)
TANDEM_LAYERS_CUDA_INSTANTIATE(__half)

}  // namespace tandem::kernels::cuda
