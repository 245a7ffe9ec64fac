#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/l2_prefetch.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 32;  // one warp a CTA: each thread issues whole chunks
constexpr int kMaxCtas = 32;  // spread over this many SMs' bulk-copy units at most

// The non-empty ranges, by value (__grid_constant__).
struct PrefetchParams {
  L2PrefetchRange ranges[kL2PrefetchMaxRanges];
  int num_ranges = 0;
  bool after_wait = false;  // issue after griddepcontrol.wait (L2Prefetch's issue_after_wait)
};

__device__ __forceinline__ void PrefetchLine(const void* addr) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(addr) : "memory");
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void BulkPrefetch(const void* addr, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(addr), "r"(bytes) : "memory");
}

// Range r's aligned body [begin, end) (16-byte aligned bounds; empty when the range holds no
// aligned 16 bytes) and its chunk count.
struct Body {
  uintptr_t begin = 0, end = 0;
  int64_t chunks = 0;
};
__device__ __forceinline__ Body BodyOf(const L2PrefetchRange& r) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(r.ptr);
  Body b;
  b.begin = (p + 15) & ~uintptr_t{15};
  b.end = (p + static_cast<uintptr_t>(r.bytes)) & ~uintptr_t{15};
  if (b.end <= b.begin) {
    b.begin = b.end = p;
    return b;
  }
  b.chunks =
      static_cast<int64_t>((b.end - b.begin + kL2PrefetchChunkBytes - 1) / kL2PrefetchChunkBytes);
  return b;
}

// Every range's chunks as one sequence, strided over the grid's threads; thread 0 of CTA 0 also
// takes the unaligned head and tail bytes of each range (< 16 bytes each, so the lines of its
// first and last byte; both for a range without an aligned body: it spans < 32 bytes).
__device__ void IssuePrefetches(const PrefetchParams& p) {
  const int64_t tid = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  int64_t first = 0;  // this range's first chunk in the sequence
  for (int i = 0; i < p.num_ranges; ++i) {
    const L2PrefetchRange& r = p.ranges[i];
    const Body b = BodyOf(r);
    // The sequence's chunks tid, tid + stride, ... that fall in [first, first + b.chunks).
    int64_t c = tid >= first ? tid - first : (stride - (first - tid) % stride) % stride;
    for (; c < b.chunks; c += stride) {
      const uintptr_t a = b.begin + static_cast<uintptr_t>(c * kL2PrefetchChunkBytes);
      const uintptr_t left = b.end - a, chunk = static_cast<uintptr_t>(kL2PrefetchChunkBytes);
      const uintptr_t n = left < chunk ? left : chunk;
      BulkPrefetch(reinterpret_cast<const void*>(a), static_cast<uint32_t>(n));
    }
    first += b.chunks;
    const uintptr_t p0 = reinterpret_cast<uintptr_t>(r.ptr);
    const uintptr_t last = p0 + static_cast<uintptr_t>(r.bytes) - 1;  // bytes > 0
    if (tid == 0 && (b.chunks == 0 || b.begin > p0)) PrefetchLine(r.ptr);
    if (tid == 0 && (b.chunks == 0 || last >= b.end)) {
      PrefetchLine(reinterpret_cast<const void*>(last));
    }
  }
}
#else
constexpr int64_t kLine = 128;  // L2 line (prefetch.global.L2 fetches the line holding addr)

// Other architectures: every 128-byte line of every range (the first from the range's own
// address, so no prefetched address lies before it), strided over the grid's threads.
__device__ void IssuePrefetches(const PrefetchParams& p) {
  const int64_t tid = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int i = 0; i < p.num_ranges; ++i) {
    const uintptr_t p0 = reinterpret_cast<uintptr_t>(p.ranges[i].ptr);
    const uintptr_t base = p0 & ~static_cast<uintptr_t>(kLine - 1);
    const int64_t lines = static_cast<int64_t>((p0 + p.ranges[i].bytes - base + kLine - 1) / kLine);
    for (int64_t l = tid; l < lines; l += stride) {
      const uintptr_t a = base + static_cast<uintptr_t>(l * kLine);
      PrefetchLine(reinterpret_cast<const void*>(a > p0 ? a : p0));
    }
  }
}
#endif

__global__ void __launch_bounds__(kThreads)
    L2PrefetchKernel(const __grid_constant__ PrefetchParams p) {
  // PDL: the next kernel may launch now; this grid's completion still follows its predecessor's
  // (the wait below), so the chain's ordering and memory visibility are unchanged.
  internal::AllowDependentLaunch();
  if (!p.after_wait) IssuePrefetches(p);  // the ranges are immutable: no wait needed
  internal::WaitForPrecedingGrid();
  if (p.after_wait) IssuePrefetches(p);
}

}  // namespace

absl::Status L2Prefetch(const L2PrefetchRange* ranges, int num_ranges, cudaStream_t stream,
                        bool programmatic_launch, bool issue_after_wait) {
  if (num_ranges < 0 || num_ranges > kL2PrefetchMaxRanges) {
    return absl::InvalidArgumentError(absl::StrCat("cuda::L2Prefetch: ", num_ranges,
                                                   " ranges (at most ", kL2PrefetchMaxRanges, ")"));
  }
  if (num_ranges > 0 && ranges == nullptr) {
    return absl::InvalidArgumentError("cuda::L2Prefetch: null ranges");
  }
  PrefetchParams params;
  params.after_wait = issue_after_wait;
  int64_t chunks = 0;
  for (int i = 0; i < num_ranges; ++i) {
    const L2PrefetchRange& r = ranges[i];
    if (r.bytes < 0 || (r.ptr == nullptr && r.bytes > 0)) {
      return absl::InvalidArgumentError(absl::StrCat("cuda::L2Prefetch: range ", i, " of ", r.bytes,
                                                     " bytes at ",
                                                     r.ptr == nullptr ? "null" : "a pointer"));
    }
    if (r.bytes == 0) continue;
    params.ranges[params.num_ranges++] = r;
    chunks += (r.bytes + kL2PrefetchChunkBytes - 1) / kL2PrefetchChunkBytes + 1;
  }
  if (params.num_ranges == 0) return absl::OkStatus();
  const int ctas =
      static_cast<int>(std::clamp<int64_t>((chunks + kThreads - 1) / kThreads, 1, kMaxCtas));
  const internal::PdlLaunchConfig config(dim3(ctas), dim3(kThreads), stream, programmatic_launch);
  CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(config.get(), L2PrefetchKernel, params));
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
