// Microbenchmark of the KV cache manager's scheduler-side cost: 256 running requests that share a
// system prompt, prefilled once, then decoding one token per step (Allocate one more token, then
// CacheBlocks, as the scheduler does every step). Prints microseconds per operation; no asserts.
//
//   bazel run -c opt //runtime/kv_cache:kv_cache_bench
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "runtime/kv_cache/kv_cache_manager.h"

namespace tandem::runtime {
namespace {

constexpr int kNumRequests = 256;
constexpr int64_t kBlockSize = 16;
constexpr int kSystemPromptTokens = 256;
constexpr int kPromptTokens = 512;  // system prompt + 256 private tokens
constexpr int kDecodeSteps = 1024;

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point start, int64_t ops) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count() / ops;
}

int Run() {
  std::mt19937 rng(12345);  // fixed: runs are comparable
  std::uniform_int_distribution<int32_t> token(0, 150000);
  const int64_t blocks_per_request = (kPromptTokens + kDecodeSteps) / kBlockSize + 1;
  auto kv_or = KvCacheManager::Create(
      {.num_blocks = kNumRequests * blocks_per_request, .block_size = kBlockSize});
  if (!kv_or.ok()) {
    std::fprintf(stderr, "%s\n", kv_or.status().ToString().c_str());
    return 1;
  }
  KvCacheManager& kv = **kv_or;

  std::vector<int32_t> system_prompt(kSystemPromptTokens);
  for (int32_t& t : system_prompt) t = token(rng);
  std::vector<std::vector<int32_t>> tokens(kNumRequests);
  for (auto& request : tokens) {
    request = system_prompt;
    while (request.size() < kPromptTokens) request.push_back(token(rng));
  }

  // Prefill: lookup (request 0 misses, the rest hit the system prompt), allocate, cache.
  Clock::time_point start = Clock::now();
  for (int id = 0; id < kNumRequests; ++id) {
    const PrefixMatch hit = kv.FindCachedPrefix(tokens[id], "", /*record_stats=*/true);
    if (!kv.Allocate(id, kPromptTokens, &hit)) return 1;
    kv.CacheBlocks(id, tokens[id], "", kPromptTokens);
  }
  const double prefill_us = MicrosSince(start, kNumRequests);

  // Decode: one more token per request per step.
  double allocate_us = 0, cache_us = 0;
  for (int step = 0; step < kDecodeSteps; ++step) {
    for (auto& request : tokens) request.push_back(token(rng));
    start = Clock::now();
    for (int id = 0; id < kNumRequests; ++id) {
      if (!kv.Allocate(id, tokens[id].size(), nullptr)) return 1;
    }
    allocate_us += std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    start = Clock::now();
    for (int id = 0; id < kNumRequests; ++id) {
      kv.CacheBlocks(id, tokens[id], "", tokens[id].size());
    }
    cache_us += std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  }
  const int64_t decode_ops = int64_t{kNumRequests} * kDecodeSteps;

  // Full-hit lookup of a whole context (prompt + decoded tokens; 95 blocks hashed and found).
  constexpr int kLookups = 2000;
  start = Clock::now();
  int64_t hit_tokens = 0;
  for (int i = 0; i < kLookups; ++i) {
    hit_tokens += kv.FindCachedPrefix(tokens[i % kNumRequests], "", false).num_tokens;
  }
  const double lookup_us = MicrosSince(start, kLookups);

  // The hashing underneath, per block of 16 tokens.
  constexpr int kHashes = 100000;
  BlockHash chain;
  start = Clock::now();
  for (int i = 0; i < kHashes; ++i) {
    chain = HashNextBlock(i == 0 ? nullptr : &chain,
                          absl::Span<const int32_t>(tokens[0]).subspan(0, kBlockSize), "");
  }
  const double hash_next_us = MicrosSince(start, kHashes);
  start = Clock::now();
  int64_t num_hashes = 0;
  for (int i = 0; i < kHashes / 64; ++i) {
    num_hashes += ComputeBlockHashes(tokens[i % kNumRequests], kBlockSize, "").size();
  }
  const double compute_hashes_us = MicrosSince(start, num_hashes);

  start = Clock::now();
  for (int id = 0; id < kNumRequests; ++id) kv.Free(id);
  const double free_us = MicrosSince(start, kNumRequests);

  const KvCacheStats stats = kv.Stats();
  std::printf(
      "kv_cache_bench: %d requests, block_size %ld, %ld blocks, prompt %d (%d shared), "
      "%d decode steps\n",
      kNumRequests, kBlockSize, stats.num_blocks, kPromptTokens, kSystemPromptTokens, kDecodeSteps);
  std::printf("  prefill (lookup + allocate + cache 512 tokens): %8.3f us/request\n", prefill_us);
  std::printf("  decode Allocate(+1 token):                       %8.3f us/op\n",
              allocate_us / decode_ops);
  std::printf("  decode CacheBlocks(+1 token):                    %8.3f us/op\n",
              cache_us / decode_ops);
  std::printf("  decode step, 256 requests (allocate + cache):    %8.3f us/step\n",
              (allocate_us + cache_us) / kDecodeSteps);
  std::printf("  FindCachedPrefix, 1536-token context (hit %ld):  %8.3f us/op\n",
              hit_tokens / kLookups, lookup_us);
  std::printf("  Free (%ld blocks/request):                       %8.3f us/op\n",
              blocks_per_request - 1, free_us);
  std::printf("  HashNextBlock:                                   %8.3f us/block\n", hash_next_us);
  std::printf("  ComputeBlockHashes (1536 tokens):                %8.3f us/block\n",
              compute_hashes_us);
  std::printf("  cached blocks %ld, prefill hit rate %.3f\n", stats.num_cached_blocks,
              stats.HitRate());
  return 0;
}

}  // namespace
}  // namespace tandem::runtime

int main() { return tandem::runtime::Run(); }
