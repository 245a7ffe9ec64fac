// Test support for attention kernels (CPU now, CUDA later): random paged batches built the way
// the engine builds them, and an fp64 reference attention that works on each sequence's
// CONTIGUOUS K/V, so comparing against it checks the paging independently.
#ifndef TANDEM_KERNELS_ATTENTION_ATTENTION_TEST_UTIL_H_
#define TANDEM_KERNELS_ATTENTION_ATTENTION_TEST_UTIL_H_

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention/kv_cache_layout.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/threading/thread_pool.h"

namespace tandem::kernels::attention_test {

// A fresh seed from std::random_device, or $TANDEM_TEST_SEED when set (to replay a failure).
// Printed and recorded as the test property "seed".
uint32_t TestSeed();

// n samples of N(0, stddev^2).
std::vector<float> RandomNormal(std::mt19937& rng, int64_t n, float stddev);

struct SeqSpec {
  int64_t seq_len = 0;  // context including the new tokens
  int64_t q_len = 0;    // new (query) tokens
};

struct CaseOptions {
  int64_t num_q_heads = 8;
  int64_t num_kv_heads = 2;
  int64_t head_dim = 64;
  int64_t block_size = 16;
  int64_t num_layers = 2;
  int64_t layer = 1;         // the layer attended; the others hold different data
  int64_t spare_blocks = 3;  // pool blocks no sequence uses (left NaN)
  int64_t spare_table_columns = 2;
  float q_stddev = 1.0f;
  float kv_stddev = 1.0f;
};

// A batch over a paged pool. Each sequence's K/V (every layer) is random and contiguous here,
// and was written into the pool through ReshapeAndCache at shuffled physical blocks. Pool
// slots no sequence owns are NaN, so a kernel that reads them produces NaN; unused block-table
// entries are -1.
struct PagedCase {
  CaseOptions options;
  KvCacheLayout layout;
  std::vector<SeqSpec> seqs;
  std::vector<float> pool;  // layout.TotalElems()
  // Per sequence: [seq_len, num_kv_heads, head_dim] of `layer`, every GLOBAL position (also in
  // a DCP shard case, whose pool holds only the shard's rows).
  std::vector<std::vector<float>> k;
  std::vector<std::vector<float>> v;     // same
  std::vector<float> q;                  // [num_tokens, num_q_heads, head_dim]
  std::vector<int32_t> query_start_loc;  // [num_seqs + 1]
  std::vector<int32_t> seq_lens;         // [num_seqs]
  std::vector<int32_t> block_tables;     // [num_seqs, max_blocks_per_seq]
  std::vector<int32_t> local_seq_lens;   // DCP shard cases only: [num_seqs], else empty
  int64_t max_blocks_per_seq = 0;
  int64_t num_tokens = 0;

  AttentionBatch Batch() const;
  KvCacheView View() { return {pool.data(), layout}; }
};

PagedCase MakePagedCase(std::mt19937& rng, const CaseOptions& options,
                        const std::vector<SeqSpec>& seqs);

// Rank dcp.rank's KV shard of `global` (decode context parallelism, dcp_shard.h): the same q,
// query_start_loc and GLOBAL seq_lens, local_seq_lens = DcpLocalCount(seq_len), and a fresh pool
// (shuffled blocks) holding local row j = global row DcpGlobalPos(j) of layer options.layer;
// every other layer and every unowned slot is NaN. k and v keep the global rows, so
// ReferenceAttention(shard, params with the same dcp) is the shard's expected partial.
PagedCase MakeDcpShardCase(std::mt19937& rng, const PagedCase& global, const DcpShard& dcp);

// fp64 attention of one sequence over its contiguous K/V, with the causal, window and softcap
// semantics of PagedAttention, restricted further to keys [key_begin, key_end) (partials) and,
// when params.dcp_size > 1, to the keys of shard params.dcp_rank (positions g with
// (g / interleave) % size == rank; k and v still hold every global position).
// q: [q_len, num_q_heads, head_dim]; k, v: [seq_len, num_kv_heads, head_dim];
// out: [q_len, num_q_heads, head_dim]; lse: [q_len, num_q_heads] (-inf where no key is visible).
void ReferenceAttentionSeq(const float* q, const float* k, const float* v, int64_t q_len,
                           int64_t seq_len, int64_t num_q_heads, int64_t num_kv_heads,
                           int64_t head_dim, const AttentionParams& params, int64_t key_begin,
                           int64_t key_end, double* out, double* lse);

struct Reference {
  std::vector<double> out;  // [num_tokens, num_q_heads, head_dim]
  std::vector<double> lse;  // [num_tokens, num_q_heads]
};
Reference ReferenceAttention(const PagedCase& c, const AttentionParams& params,
                             int64_t key_begin = 0,
                             int64_t key_end = std::numeric_limits<int64_t>::max());

// The CPU kernel's output and lse for `c` (buffers pre-filled with a sentinel, so anything the
// kernel leaves unwritten shows); a kernel error fails the calling test.
struct KernelResult {
  std::vector<float> out;  // [num_tokens, num_q_heads, head_dim]
  std::vector<float> lse;  // [num_tokens, num_q_heads]
};
KernelResult RunCpuPagedAttention(PagedCase& c, const AttentionParams& params, ThreadPool* pool);

// max |actual - expected| <= rel_tol * max|expected| (rel_tol absolute if expected is all 0);
// NaN fails. Reports the worst element.
::testing::AssertionResult OutClose(const std::vector<float>& actual,
                                    const std::vector<double>& expected, double rel_tol);
// Infinite expected values must match exactly; finite ones within tol * max(1, |expected|).
::testing::AssertionResult LseClose(const std::vector<float>& actual,
                                    const std::vector<double>& expected, double tol);

}  // namespace tandem::kernels::attention_test

#endif  // TANDEM_KERNELS_ATTENTION_ATTENTION_TEST_UTIL_H_
