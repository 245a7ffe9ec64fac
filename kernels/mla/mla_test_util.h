// Host helpers shared by the kernels/mla GPU tests and benchmarks (mla_cuda_test_util,
// mla_prefill_cuda_test, mla_cuda_bench, mla_prefill_cuda_bench): DeepSeek's attention widths,
// latents laid out on shuffled pages, and the benchmarks' list flags.
#ifndef TANDEM_KERNELS_MLA_MLA_TEST_UTIL_H_
#define TANDEM_KERNELS_MLA_MLA_TEST_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "kernels/attention/kv_cache_layout.h"
#include "kernels/mla/mla_attention.h"

namespace tandem::kernels::mla_test {

// DeepSeek-V3 (128 heads) and V2-Lite (16): nope 128, rope 64, latent 512, v 128.
inline constexpr MlaDims kV3Dims{.num_heads = 128,
                                 .qk_nope_head_dim = 128,
                                 .qk_rope_head_dim = 64,
                                 .kv_lora_rank = 512,
                                 .v_head_dim = 128};
inline constexpr MlaDims kLiteDims{.num_heads = 16,
                                   .qk_nope_head_dim = 128,
                                   .qk_rope_head_dim = 64,
                                   .kv_lora_rank = 512,
                                   .v_head_dim = 128};

// Request s's lens[s] latents on ceil(lens[s] / block_size) pages drawn in order from one shuffle
// of num_blocks = S * max_blocks + 2 block ids (one std::shuffle of `rng`); tables [S,
// max_blocks] (unused entries 0); slots: every latent's slot, request by request.
struct ShuffledPages {
  int64_t num_blocks = 0;
  int64_t max_blocks = 0;  // pages of the longest request
  int64_t max_len = 0;     // the longest request's latents
  std::vector<int32_t> tables;
  std::vector<int64_t> slots;

  // The tests' latent pool over these pages: 2 layers, one latent "head" of latent_dim.
  KvCacheLayout Layout(int64_t block_size, int64_t latent_dim) const {
    return KvCacheLayout{.num_blocks = num_blocks,
                         .num_layers = 2,
                         .block_size = block_size,
                         .num_kv_heads = 1,
                         .head_dim = latent_dim,
                         .num_planes = 1};
  }
};

inline ShuffledPages ShufflePages(const std::vector<int32_t>& lens, int64_t block_size,
                                  std::mt19937& rng) {
  ShuffledPages p;
  const int64_t S = static_cast<int64_t>(lens.size());
  for (int32_t len : lens) {
    p.max_blocks = std::max<int64_t>(p.max_blocks, (len + block_size - 1) / block_size);
    p.max_len = std::max<int64_t>(p.max_len, len);
  }
  p.num_blocks = S * p.max_blocks + 2;
  std::vector<int32_t> ids(p.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  p.tables.assign(S * p.max_blocks, 0);
  int64_t next = 0;
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t b = 0; b < (lens[s] + block_size - 1) / block_size; ++b) {
      p.tables[s * p.max_blocks + b] = ids[next++];
    }
    for (int64_t j = 0; j < lens[s]; ++j) {
      p.slots.push_back(int64_t{p.tables[s * p.max_blocks + j / block_size]} * block_size +
                        j % block_size);
    }
  }
  return p;
}

// "a,b,c" -> {a, b, c} (entries that are not integers skipped); null -> `dflt`.
inline std::vector<int64_t> ParseInt64List(const char* arg, std::vector<int64_t> dflt) {
  if (arg == nullptr) return dflt;
  std::vector<int64_t> out;
  for (absl::string_view s : absl::StrSplit(arg, ',')) {
    int64_t v = 0;
    if (absl::SimpleAtoi(s, &v)) out.push_back(v);
  }
  return out;
}

}  // namespace tandem::kernels::mla_test

#endif  // TANDEM_KERNELS_MLA_MLA_TEST_UTIL_H_
