// Absorbed vs unabsorbed MLA on the CPU (the choice of kMlaAbsorbMaxQueryLen): one sequence of
// `ctx` cached latents and q_len new query tokens, DeepSeek-V2-Lite's per-layer shape (16 heads,
// latent 512 + 64, nope 128, v 128), 2 threads. Prints ms per call of each mode.
//
//   bazel run //kernels/mla:mla_attention_bench
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/mla/mla_attention.h"

namespace tandem::kernels {
namespace {

template <typename Fn>
double BestMs(Fn&& fn) {
  using Clock = std::chrono::steady_clock;
  fn();
  double best = 1e30, total = 0;
  for (int rep = 0; rep < 20 && (rep < 2 || total < 0.5); ++rep) {
    const auto start = Clock::now();
    fn();
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::min(best, s);
    total += s;
  }
  return best * 1e3;
}

void Run() {
  const MlaDims d{16, 128, 64, 512, 128};
  ThreadPool pool(2);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  auto random = [&](int64_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
  };
  const std::vector<float> kv_b =
      random(d.num_heads * (d.qk_nope_head_dim + d.v_head_dim) * d.kv_lora_rank);
  std::printf("%6s %6s %12s %14s %8s\n", "ctx", "q_len", "absorbed_ms", "unabsorbed_ms", "ratio");
  for (int64_t ctx : {256, 1024, 4096}) {
    KvCacheLayout layout;
    layout.num_layers = 1;
    layout.block_size = 16;
    layout.num_kv_heads = 1;
    layout.num_planes = 1;
    layout.head_dim = d.LatentDim();
    layout.num_blocks = ctx / 16;
    std::vector<float> pool_data = random(layout.TotalElems());
    std::vector<int32_t> table(layout.num_blocks);
    for (int32_t b = 0; b < layout.num_blocks; ++b) table[b] = b;
    for (int64_t q_len : {1, 2, 4, 8, 16, 64}) {
      const std::vector<float> q = random(q_len * d.num_heads * d.QkHeadDim());
      std::vector<float> out(q_len * d.num_heads * d.v_head_dim);
      const std::vector<int32_t> qsl = {0, static_cast<int32_t>(q_len)};
      const std::vector<int32_t> lens = {static_cast<int32_t>(ctx)};
      AttentionBatch batch;
      batch.query_start_loc = qsl.data();
      batch.seq_lens = lens.data();
      batch.block_tables = table.data();
      batch.num_seqs = 1;
      batch.max_blocks_per_seq = layout.num_blocks;
      double ms[2];
      for (int m = 0; m < 2; ++m) {
        const MlaMode mode = m == 0 ? MlaMode::kAbsorbed : MlaMode::kUnabsorbed;
        ms[m] = BestMs([&] {
          (void)cpu::MlaPagedAttention(q.data(), kv_b.data(), d, {pool_data.data(), layout}, 0,
                                       batch, 0.1f, mode, out.data(), nullptr, &pool);
        });
      }
      std::printf("%6ld %6ld %12.2f %14.2f %8.2f\n", static_cast<long>(ctx),
                  static_cast<long>(q_len), ms[0], ms[1], ms[0] / ms[1]);
      std::fflush(stdout);
    }
  }
}

}  // namespace
}  // namespace tandem::kernels

int main() { tandem::kernels::Run(); }
