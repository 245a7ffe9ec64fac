// StreamingCopy against a byte loop: every alignment of source and destination, lengths around
// the streaming threshold, the 128-byte body and the end of its prefetching part, and the bytes
// next to the destination untouched.
#include "kvtransfer/streaming_copy.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::kvtransfer {
namespace {

TEST(StreamingCopyTest, MatchesByteCopyForAllAlignmentsAndLengths) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  constexpr size_t kMax = (size_t{1} << 20) + 1000;
  std::vector<uint8_t> src(kMax + 64), dst(kMax + 128), expect(kMax + 128);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  // 639-769: around where the body loop stops prefetching (512 bytes before the end).
  const std::vector<size_t> lengths = {0,     1,      15,     16,     127,  128,   256,  257,
                                       639,   640,    641,    767,    768,  769,   1000, 4095,
                                       65536, 262143, 262144, 262145, kMax, 300001};
  for (size_t n : lengths) {
    for (int trial = 0; trial < 4; ++trial) {
      const size_t so = rng() % 64;
      const size_t doff = 1 + rng() % 63;  // >= 1: the byte before must stay untouched
      const uint8_t fill = static_cast<uint8_t>(rng());
      std::fill(dst.begin(), dst.end(), fill);
      expect = dst;
      for (size_t i = 0; i < n; ++i) expect[doff + i] = src[so + i];
      // Small thresholds too, so short copies take the streaming path.
      const size_t threshold = trial % 2 == 0 ? kDefaultMinStreamingBytes : 0;
      StreamingCopy(dst.data() + doff, src.data() + so, n, threshold);
      ASSERT_EQ(dst, expect) << "n=" << n << " src+" << so << " dst+" << doff;
    }
  }
}

// StridedStreamingCopy against a row-by-row byte loop: row lengths around the 128-byte body and
// the prefetch distance (which runs on into the next row), unaligned rows and strides, gaps left
// untouched, both the streaming and the memcpy path, and the row-group path (aligned destination
// rows, gaps in the source) with row counts that leave a remainder.
TEST(StreamingCopyTest, StridedMatchesRowByRowCopy) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (size_t row : {1, 100, 127, 128, 129, 256, 500, 512, 640, 1024, 1031, 4096}) {
    for (int trial = 0; trial < 6; ++trial) {
      const size_t rows = 1 + rng() % 300;
      const size_t src_stride = row + rng() % (row + 1);
      size_t dst_stride = row + (trial == 0 ? 0 : rng() % (row + 1));
      // Trials 3-5: 16-byte aligned destination rows (the row-group path for source gaps).
      const bool aligned = trial >= 3;
      if (aligned) dst_stride = (dst_stride + 15) & ~size_t{15};
      const size_t so = rng() % 64;
      std::vector<uint8_t> src(so + rows * src_stride), dst(64 + rows * dst_stride + 64);
      size_t doff = 1 + rng() % 63;  // >= 1: the byte before must stay untouched
      if (aligned) doff = 16 + ((16 - reinterpret_cast<uintptr_t>(dst.data() + 16)) & 15);
      for (auto& b : src) b = static_cast<uint8_t>(rng());
      const uint8_t fill = static_cast<uint8_t>(rng());
      std::fill(dst.begin(), dst.end(), fill);
      std::vector<uint8_t> expect = dst;
      for (size_t r = 0; r < rows; ++r) {
        for (size_t i = 0; i < row; ++i) {
          expect[doff + r * dst_stride + i] = src[so + r * src_stride + i];
        }
      }
      const size_t threshold = trial % 2 == 0 ? 0 : kDefaultMinStreamingBytes;
      StridedStreamingCopy(dst.data() + doff, dst_stride, src.data() + so, src_stride, row, rows,
                           threshold);
      ASSERT_EQ(dst, expect) << "row " << row << " x " << rows << " strides " << src_stride
                             << " -> " << dst_stride;
    }
  }
}

}  // namespace
}  // namespace tandem::kvtransfer
