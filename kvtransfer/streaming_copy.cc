#include "kvtransfer/streaming_copy.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

namespace tandem::kvtransfer {
namespace {

#if defined(__x86_64__)
// Source bytes are prefetched this far ahead of the loads (8 cache lines; 256 and 1024 measured
// a few percent slower on the dev VM, no prefetch ~4% slower).
constexpr size_t kPrefetchBytes = 512;

// Copies 128 bytes (two cache lines) from s to the 16-byte aligned d with streaming stores. The
// eight loads name eight registers: written as an array with inner loops, GCC 12 kept the array
// on the stack (a load, a spill and a reload per 16 bytes), which cost ~25% of the bandwidth.
template <bool kPrefetch>
inline void Copy128(char* d, const char* s) {
  if constexpr (kPrefetch) {
    _mm_prefetch(s + kPrefetchBytes, _MM_HINT_T0);
    _mm_prefetch(s + kPrefetchBytes + 64, _MM_HINT_T0);
  }
  const __m128i r0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  const __m128i r1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
  const __m128i r2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
  const __m128i r3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
  const __m128i r4 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 64));
  const __m128i r5 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 80));
  const __m128i r6 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 96));
  const __m128i r7 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 112));
  _mm_stream_si128(reinterpret_cast<__m128i*>(d), r0);
  _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), r1);
  _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), r2);
  _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), r3);
  _mm_stream_si128(reinterpret_cast<__m128i*>(d + 64), r4);
  _mm_stream_si128(reinterpret_cast<__m128i*>(d + 80), r5);
  _mm_stream_si128(reinterpret_cast<__m128i*>(d + 96), r6);
  _mm_stream_si128(reinterpret_cast<__m128i*>(d + 112), r7);
}

// Copies 64 bytes (one cache line) from s to the 16-byte aligned d with streaming stores.
inline void Copy64(char* d, const char* s) {
  const __m128i r0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  const __m128i r1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
  const __m128i r2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
  const __m128i r3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
  _mm_stream_si128(reinterpret_cast<__m128i*>(d), r0);
  _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), r1);
  _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), r2);
  _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), r3);
}

// Source rows with gaps between them (a rank reading its share of wider rows): copies rows in
// groups of kRowGroup side by side, line i of each row in turn, prefetching the next group's
// lines. One row at a time the hardware prefetcher runs past each row's end into the gap and
// few misses are in flight; several rows at once keep several streams going. Measured on the
// dev VM (one thread, 128 MiB, contiguous 21-23 GB/s): 1 KiB of every 2 KiB 13.3 GB/s row by
// row, 17.5-19.9 in groups of 4 (8: 15.8-16.7); 512 B of every 2 KiB 8.6-10 row by row, 12.5
// in groups of 4, 15.1-15.5 in groups of 8. Returns the rows it copied (whole groups); the
// caller copies the rest. REQUIRES: d and dst_stride 16-byte aligned, row_bytes >= 64.
template <size_t kRowGroup>
size_t CopyRowGroups(char* d, size_t dst_stride, const char* s, size_t src_stride, size_t row_bytes,
                     size_t rows) {
  const size_t lines = row_bytes & ~size_t{63};
  size_t r = 0;
  for (; r + kRowGroup <= rows; r += kRowGroup) {
    const char* src = s + r * src_stride;
    char* dst = d + r * dst_stride;
    const bool next_group = r + 2 * kRowGroup <= rows;
    for (size_t i = 0; i < lines; i += 64) {
      for (size_t k = 0; k < kRowGroup; ++k) {
        if (next_group) _mm_prefetch(src + (k + kRowGroup) * src_stride + i, _MM_HINT_T0);
        Copy64(dst + k * dst_stride + i, src + k * src_stride + i);
      }
    }
    for (size_t k = 0; k < kRowGroup; ++k) {
      std::memcpy(dst + k * dst_stride + lines, src + k * src_stride + lines, row_bytes - lines);
    }
  }
  return r;
}
#endif

}  // namespace

void StreamingCopy(void* dst, const void* src, size_t n, size_t min_streaming_bytes) {
#if defined(__x86_64__)
  if (n < min_streaming_bytes || n < 256) {
    std::memcpy(dst, src, n);
    return;
  }
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  // Head: ordinary copy up to a 16-byte aligned destination (streaming stores need alignment;
  // the loads may be unaligned).
  const size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  const size_t body = n & ~size_t{127};
  size_t i = 0;
  // Prefetches stay inside the source: past its end they would touch unrelated (maybe
  // unmapped) pages.
  for (; i + 128 + kPrefetchBytes <= body; i += 128) Copy128<true>(d + i, s + i);
  for (; i < body; i += 128) Copy128<false>(d + i, s + i);
  // Streaming stores are weakly ordered: fence so the bytes are globally visible before whoever
  // observes the copy's completion (another thread, a DMA engine) looks at them.
  _mm_sfence();
  std::memcpy(d + body, s + body, n - body);
#else
  (void)min_streaming_bytes;
  std::memcpy(dst, src, n);
#endif
}

void StridedStreamingCopy(void* dst, size_t dst_stride, const void* src, size_t src_stride,
                          size_t row_bytes, size_t rows, size_t min_streaming_bytes) {
  if (rows == 0) return;
  if (rows == 1 || (dst_stride == row_bytes && src_stride == row_bytes)) {
    StreamingCopy(dst, src, rows * row_bytes, min_streaming_bytes);
    return;
  }
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
#if defined(__x86_64__)
  if (rows * row_bytes >= min_streaming_bytes && row_bytes >= 128) {
    size_t r = 0;
    if (src_stride != row_bytes && row_bytes >= 256 && (reinterpret_cast<uintptr_t>(d) & 15) == 0 &&
        dst_stride % 16 == 0) {
      r = row_bytes <= 512 ? CopyRowGroups<8>(d, dst_stride, s, src_stride, row_bytes, rows)
                           : CopyRowGroups<4>(d, dst_stride, s, src_stride, row_bytes, rows);
      d += r * dst_stride;
      s += r * src_stride;
    }
    for (; r < rows; ++r, d += dst_stride, s += src_stride) {
      const char* next = r + 1 < rows ? s + src_stride : nullptr;
      // Prefetches `ahead` bytes into this row, or past its end into the next row's start.
      auto prefetch = [&](size_t ahead) {
        if (ahead < row_bytes) {
          _mm_prefetch(s + ahead, _MM_HINT_T0);
        } else if (next != nullptr && ahead - row_bytes < row_bytes) {
          _mm_prefetch(next + (ahead - row_bytes), _MM_HINT_T0);
        }
      };
      const size_t head =
          std::min<size_t>(row_bytes, (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15);
      std::memcpy(d, s, head);
      const size_t body = (row_bytes - head) & ~size_t{127};
      for (size_t i = head; i < head + body; i += 128) {
        prefetch(i + kPrefetchBytes);
        prefetch(i + kPrefetchBytes + 64);
        Copy128<false>(d + i, s + i);
      }
      std::memcpy(d + head + body, s + head + body, row_bytes - head - body);
    }
    _mm_sfence();
    return;
  }
#else
  (void)min_streaming_bytes;
#endif
  for (size_t r = 0; r < rows; ++r, d += dst_stride, s += src_stride) std::memcpy(d, s, row_bytes);
}

}  // namespace tandem::kvtransfer
