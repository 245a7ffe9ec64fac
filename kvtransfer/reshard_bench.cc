// reshard_bench: the staging cost of a heterogeneous-TP KV transfer on this machine. For one
// request of Llama-3-8B KV shapes (32 layers, 8 KV heads, head_dim 128, bf16, block 16) it times
// the source's gather of a head slice into one staging region, the destination's scatter out of
// it, and the direct copy of whole blocks that equal TP does instead, as GB/s of request bytes.
// (The transfer itself moves the same bytes either way; with P TP=a -> D TP=b the staging adds
// one gather and one scatter pass over each rank's share.)
//
//   bazel run -c opt //kvtransfer:reshard_bench -- [--tokens=4096] [--iters=5]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "kvtransfer/reshard.h"

ABSL_FLAG(int, tokens, 4096, "request length in tokens");
ABSL_FLAG(int, iters, 5, "repetitions (best reported)");

namespace tandem::kvtransfer {
namespace {

template <typename Fn>
double BestSeconds(Fn fn) {
  double best = 1e30;
  for (int i = 0; i < absl::GetFlag(FLAGS_iters); ++i) {
    const absl::Time t = absl::Now();
    fn();
    best = std::min(best, absl::ToDoubleSeconds(absl::Now() - t));
  }
  return best;
}

void Run() {
  const int64_t L = 32, bs = 16, H = 8, head_bytes = 128 * 2;
  const int64_t n = (absl::GetFlag(FLAGS_tokens) + bs - 1) / bs;
  const int64_t pool_blocks = n + n / 4;
  std::mt19937 rng(1);
  std::vector<int32_t> ids(pool_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(n);
  std::printf("request: %lld tokens, %lld blocks (random physical ids)\n",
              static_cast<long long>(n * bs), static_cast<long long>(n));
  std::printf("%-28s %10s %12s %10s\n", "case (per rank)", "MiB", "ms", "GB/s");
  for (int src_tp : {1, 2, 4}) {
    const BlockShape shape{L, bs, H / src_tp, head_bytes};
    std::vector<char> pool(pool_blocks * shape.BlockBytes(), 1), dst(pool.size(), 0);
    const double bytes = static_cast<double>(n * shape.BlockBytes());
    const double direct = BestSeconds([&] {
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(dst.data() + ids[n - 1 - i] * shape.BlockBytes(),
                    pool.data() + ids[i] * shape.BlockBytes(), shape.BlockBytes());
      }
    });
    std::printf("direct blocks, %d KV heads    %10.1f %12.2f %10.2f\n",
                static_cast<int>(shape.num_kv_heads), bytes / (1 << 20), direct * 1e3,
                bytes / direct / 1e9);
    // Half of this rank's heads (what a rank of a group twice as large takes from it).
    if (shape.num_kv_heads < 2) continue;
    const int half = static_cast<int>(shape.num_kv_heads / 2);
    std::vector<char> staging(StagingBytes(shape, n, half));
    const double gather = BestSeconds([&] {
      (void)GatherHeads(pool.data(), shape, pool_blocks, ids, 0, half, staging.data(),
                        staging.size());
    });
    const double scatter = BestSeconds([&] {
      (void)ScatterHeads(staging.data(), staging.size(), dst.data(), shape, pool_blocks, ids, 0,
                         half);
    });
    const double sb = static_cast<double>(staging.size());
    std::printf("gather %d of %d heads          %10.1f %12.2f %10.2f\n", half,
                static_cast<int>(shape.num_kv_heads), sb / (1 << 20), gather * 1e3,
                sb / gather / 1e9);
    std::printf("scatter %d of %d heads         %10.1f %12.2f %10.2f\n", half,
                static_cast<int>(shape.num_kv_heads), sb / (1 << 20), scatter * 1e3,
                sb / scatter / 1e9);
  }
}

}  // namespace
}  // namespace tandem::kvtransfer

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  tandem::kvtransfer::Run();
  return 0;
}
