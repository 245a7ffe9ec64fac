#include "kvtransfer/streaming_copy.h"

#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace tandem::kvtransfer {

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
  // 128 bytes (two cache lines) per iteration: 8 loads in flight, then 8 streaming stores.
  const size_t body = n & ~size_t{127};
  for (size_t i = 0; i < body; i += 128) {
    __m128i r[8];
    for (int k = 0; k < 8; ++k) {
      r[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16 * k));
    }
    for (int k = 0; k < 8; ++k) _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16 * k), r[k]);
  }
  // Streaming stores are weakly ordered: fence so the bytes are globally visible before whoever
  // observes the copy's completion (another thread, a DMA engine) looks at them.
  _mm_sfence();
  std::memcpy(d + body, s + body, n - body);
#else
  (void)min_streaming_bytes;
  std::memcpy(dst, src, n);
#endif
}

}  // namespace tandem::kvtransfer
