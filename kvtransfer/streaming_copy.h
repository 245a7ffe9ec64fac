// StreamingCopy: memcpy with non-temporal (cache-bypassing) stores for large copies.
//
// Why: a KV block pull copies megabytes whose destination the CPU will not read soon. glibc's
// memcpy switches to non-temporal stores only above __x86_shared_non_temporal_threshold, which is
// 192 MiB on the 32 MiB-L3 dev VM (glibc 2.36, read with gdb), so a 2 MiB block copy uses
// ordinary stores: every destination line is first read (read-for-ownership) and then evicted,
// ~1.5x the memory traffic. Streaming stores write whole lines without reading them. Measured on
// the dev VM (random 2 MiB blocks of a 2 GiB shared mapping, one thread, quiet): memcpy 9 GB/s,
// this 16-17 GB/s (the same as glibc's own non-temporal loop on >= 192 MiB copies); the same
// effect shows as UCX's shared-memory GET (which calls memcpy) reaching 10-11.6 GB/s with
// GLIBC_TUNABLES=glibc.cpu.x86_non_temporal_threshold=0x100000 instead of 7.
//
// Copies shorter than `min_streaming_bytes` (and non-x86 builds) use memcpy: for small copies
// the cached destination is worth more than the saved traffic.
//
// Thread safety: pure function. The ranges must not overlap.
#ifndef TANDEM_KVTRANSFER_STREAMING_COPY_H_
#define TANDEM_KVTRANSFER_STREAMING_COPY_H_

#include <cstddef>
#include <cstdint>

namespace tandem::kvtransfer {

inline constexpr size_t kDefaultMinStreamingBytes = size_t{256} << 10;

void StreamingCopy(void* dst, const void* src, size_t n,
                   size_t min_streaming_bytes = kDefaultMinStreamingBytes);

// `rows` rows of `row_bytes`: row i from src + i * src_stride to dst + i * dst_stride, with
// streaming stores when rows * row_bytes >= min_streaming_bytes and a row is >= 128 bytes. Row
// by row the prefetch runs on into the next source row; when the source rows have gaps (a rank
// reading its share of wider rows) and the destination rows are 16-byte aligned, 4 rows (8 for
// rows <= 512 B) are copied side by side so several streams of misses are in flight (1 KiB of
// every 2 KiB: 13 -> 19 GB/s on one core of the dev VM; kvtransfer/BENCHMARKS.md). The rows must
// not overlap.
void StridedStreamingCopy(void* dst, size_t dst_stride, const void* src, size_t src_stride,
                          size_t row_bytes, size_t rows,
                          size_t min_streaming_bytes = kDefaultMinStreamingBytes);

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_STREAMING_COPY_H_
