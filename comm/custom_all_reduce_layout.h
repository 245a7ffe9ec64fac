// The custom all-reduce's arithmetic (custom_all_reduce.h), shared by its CUDA kernels and the
// host reference that CI runs (custom_all_reduce_reference.h): which path a message takes, the
// launch shape, and which 16-byte packs each (block, thread) touches in each phase.
//
// Paths (comm/README.md, "All-reduce paths"):
//   * one-shot: every rank copies its input into its own IPC staging buffer, meets its peers at
//     one flag barrier, then reads all N staging buffers and sums them (fp32, in rank order 0..N-1,
//     so every rank gets bit-identical results). N reads per element; lowest latency.
//   * two-shot: the message is cut into N segments; rank r sums segment r over all staging buffers
//     (reduce-scatter) into its IPC result buffer, a second barrier, then copies every other
//     segment from its owner's result buffer (all-gather). 2 reads per element: more bandwidth.
//   * NCCL: anything else (too large, not a multiple of 16 bytes, world not 2/4/8, no IPC).
//
// The barriers are per block: block b of every rank touches the same pack indices in every
// phase, so block b only waits for block b of its peers. PackOf() below is that assignment.
//
// Header-only; every function is usable from host and device code.
#ifndef TANDEM_COMM_CUSTOM_ALL_REDUCE_LAYOUT_H_
#define TANDEM_COMM_CUSTOM_ALL_REDUCE_LAYOUT_H_

#include <cstdint>

#if defined(__CUDACC__)
#define TANDEM_AR_HD __host__ __device__
#else
#define TANDEM_AR_HD
#endif

namespace tandem::comm {

inline constexpr int kArMaxRanks = 8;
inline constexpr int kArMaxBlocks = 36;
inline constexpr int kArThreads = 512;
inline constexpr int64_t kArPackBytes = 16;

enum class ArPath { kNccl, kOneShot, kTwoShot };

struct ArLimits {
  // Largest message the custom kernels take (the staging buffers are this large).
  int64_t max_bytes = int64_t{8} << 20;
  // One-shot below these sizes (vLLM's measured crossovers on full-NVLink machines, kept until
  // comm/BENCHMARKS.md says otherwise): world 2 always; world 4 below 512 KiB; world 8 below
  // 256 KiB; two-shot above.
  int64_t one_shot_below_4 = int64_t{512} << 10;
  int64_t one_shot_below_8 = int64_t{256} << 10;
};

// A launch: `blocks` x kArThreads threads over `packs` 16-byte packs; two-shot segments hold
// `segment` packs (the last one may hold fewer).
struct ArLaunch {
  ArPath path = ArPath::kNccl;
  int blocks = 0;
  int64_t packs = 0;
  int64_t segment = 0;
};

// The path and shape for `bytes` over `world` ranks (available: the IPC buffers exist).
TANDEM_AR_HD inline ArLaunch PlanAllReduce(int64_t bytes, int world, bool available,
                                           const ArLimits& limits) {
  ArLaunch out;
  if (!available || bytes <= 0 || bytes % kArPackBytes != 0 || bytes > limits.max_bytes ||
      !(world == 2 || world == 4 || world == 8)) {
    return out;
  }
  const bool one_shot = world == 2 || (world == 4 && bytes < limits.one_shot_below_4) ||
                        (world == 8 && bytes < limits.one_shot_below_8);
  out.path = one_shot ? ArPath::kOneShot : ArPath::kTwoShot;
  out.packs = bytes / kArPackBytes;
  out.segment = one_shot ? out.packs : (out.packs + world - 1) / world;
  // Enough blocks for one pack per thread of the per-rank work, at most kArMaxBlocks.
  const int64_t work = out.segment;
  const int64_t blocks = (work + kArThreads - 1) / kArThreads;
  out.blocks = static_cast<int>(blocks < 1 ? 1 : (blocks > kArMaxBlocks ? kArMaxBlocks : blocks));
  return out;
}

// The fused all-reduce + residual add + RMSNorm (CustomAllReduce::AllReduceAddRmsNorm): the
// one-shot path with whole rows per group of blocks, since a row's norm needs its whole sum.
// A row is normalized as kernels/layers/cuda's RmsNorm does it with kArNormThreads threads:
// "logical" thread t holds packs t, t + kArNormThreads, ... of the row (at most kArNormMaxVecs)
// in registers and sums their squares in that order, then the row sums the threads' sums in
// RmsNorm's order (common/block_reduce.cuh), so the result is bit-identical to the all-reduce
// followed by that kernel. Few rows (decode) spread a row's logical threads over `row_blocks`
// blocks of one thread-block cluster (kArNormThreads / row_blocks threads each; the row's sum
// crosses the blocks through distributed shared memory), so more SMs issue the peer loads.
// Group g (one cluster) handles rows g, g + groups, ...; block c of it logical threads
// [c * threads, (c + 1) * threads). Block b copies in and reads back exactly its packs, so the
// per-block barrier stays valid.
inline constexpr int kArNormThreads = 256;
inline constexpr int kArNormMaxVecs = 8;       // packs per logical thread: rows <= 16384 bf16
inline constexpr int kArNormMaxRowBlocks = 8;  // the portable cluster size

struct ArNormLaunch {
  bool fused = false;  // false: the caller all-reduces and normalizes unfused
  int blocks = 0;      // groups * row_blocks
  int row_blocks = 1;  // blocks (one cluster) per row
  int groups = 0;
  int threads = kArNormThreads;  // per block: kArNormThreads / row_blocks
  int vecs = 0;                  // packs per logical thread: 1, 2, 4 or 8
  int64_t rows = 0;
  int64_t row_packs = 0;  // 16-byte packs per row
};

// Fused where the plain all-reduce of rows x row_bytes takes the one-shot path, rows are whole
// packs of 16-bit values (bf16 / fp16) and at most kArNormMaxVecs packs per logical thread.
// row_blocks: the most (8, 4, 2, 1) with rows x row_blocks <= kArMaxBlocks and no block left
// without packs.
TANDEM_AR_HD inline ArNormLaunch PlanAllReduceNorm(int64_t rows, int64_t hidden,
                                                   int64_t element_bytes, int world, bool available,
                                                   const ArLimits& limits) {
  ArNormLaunch out;
  const int64_t row_bytes = hidden * element_bytes;
  if (element_bytes != 2 || rows <= 0 || hidden <= 0 || row_bytes % kArPackBytes != 0 ||
      row_bytes / kArPackBytes > int64_t{kArNormMaxVecs} * kArNormThreads ||
      PlanAllReduce(rows * row_bytes, world, available, limits).path != ArPath::kOneShot) {
    return out;
  }
  out.fused = true;
  out.rows = rows;
  out.row_packs = row_bytes / kArPackBytes;
  const int64_t needed = (out.row_packs + kArNormThreads - 1) / kArNormThreads;
  out.vecs = needed <= 1 ? 1 : needed <= 2 ? 2 : needed <= 4 ? 4 : 8;
  // Logical threads holding at least one pack: the last block must start below them.
  const int64_t busy = out.row_packs < kArNormThreads ? out.row_packs : kArNormThreads;
  out.row_blocks = kArNormMaxRowBlocks;
  while (out.row_blocks > 1 &&
         (rows * out.row_blocks > kArMaxBlocks ||
          int64_t{out.row_blocks - 1} * (kArNormThreads / out.row_blocks) >= busy)) {
    out.row_blocks /= 2;
  }
  out.threads = kArNormThreads / out.row_blocks;
  const int64_t groups = kArMaxBlocks / out.row_blocks;
  out.groups = static_cast<int>(rows < groups ? rows : groups);
  out.blocks = out.groups * out.row_blocks;
  return out;
}

// Pack (index in its row) that logical thread `thread` of block `block` holds as its v-th, or
// -1 when the row has fewer packs (thread < launch.threads, v < launch.vecs).
TANDEM_AR_HD inline int64_t ArNormPack(const ArNormLaunch& launch, int block, int thread, int v) {
  const int64_t t = int64_t{block % launch.row_blocks} * launch.threads + thread;
  const int64_t j = t + int64_t{v} * kArNormThreads;
  return j < launch.row_packs ? j : -1;
}

// The k-th index (k = 0, 1, ...) that thread `t` of block `b` handles among `n` (grid-stride):
// -1 past the end. One-shot: n = packs, the index is the pack. Two-shot: n = segment, the index
// i stands for pack j * segment + i of every segment j that has it.
TANDEM_AR_HD inline int64_t ArIndex(const ArLaunch& launch, int b, int t, int64_t k, int64_t n) {
  const int64_t i = (k * launch.blocks + b) * int64_t{kArThreads} + t;
  return i < n ? i : -1;
}

// Pack `i` of segment `j` in a two-shot launch, or -1 when that segment is shorter.
TANDEM_AR_HD inline int64_t ArSegmentPack(const ArLaunch& launch, int j, int64_t i) {
  const int64_t p = j * launch.segment + i;
  return p < launch.packs ? p : -1;
}

// bf16 <-> fp32 (round to nearest even; NaN kept quiet), for the host reference; the kernels use
// the CUDA intrinsics, which round the same way.
inline float ArBf16ToFloat(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
inline uint16_t ArFloatToBf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace tandem::comm

#endif  // TANDEM_COMM_CUSTOM_ALL_REDUCE_LAYOUT_H_
