#include "kernels/attention/attention_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>

#include "kernels/attention/reshape_and_cache.h"

namespace tandem::kernels::attention_test {

uint32_t TestSeed() {
  uint32_t seed = std::random_device{}();
  if (const char* env = std::getenv("TANDEM_TEST_SEED"); env != nullptr && *env != '\0') {
    seed = static_cast<uint32_t>(std::strtoul(env, nullptr, 10));
  }
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  std::cout << "seed=" << seed << " (replay with TANDEM_TEST_SEED=" << seed << ")\n";
  return seed;
}

std::vector<float> RandomNormal(std::mt19937& rng, int64_t n, float stddev) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> x(n);
  for (float& e : x) e = dist(rng);
  return x;
}

AttentionBatch PagedCase::Batch() const {
  AttentionBatch batch;
  batch.query_start_loc = query_start_loc.data();
  batch.seq_lens = seq_lens.data();
  batch.block_tables = block_tables.data();
  batch.num_seqs = static_cast<int64_t>(seqs.size());
  batch.max_blocks_per_seq = max_blocks_per_seq;
  if (!local_seq_lens.empty()) batch.local_seq_lens = local_seq_lens.data();
  return batch;
}

PagedCase MakePagedCase(std::mt19937& rng, const CaseOptions& options,
                        const std::vector<SeqSpec>& seqs) {
  PagedCase c;
  c.options = options;
  c.seqs = seqs;
  const int64_t bs = options.block_size;
  int64_t blocks_needed = 0;
  for (const SeqSpec& s : seqs) {
    const int64_t blocks = (s.seq_len + bs - 1) / bs;
    blocks_needed += blocks;
    c.max_blocks_per_seq = std::max(c.max_blocks_per_seq, blocks);
  }
  c.max_blocks_per_seq += options.spare_table_columns;
  c.layout = {.num_blocks = blocks_needed + options.spare_blocks,
              .num_layers = options.num_layers,
              .block_size = bs,
              .num_kv_heads = options.num_kv_heads,
              .head_dim = options.head_dim};
  c.pool.assign(c.layout.TotalElems(), std::numeric_limits<float>::quiet_NaN());

  // Physical blocks in random order, so a sequence's blocks are neither contiguous nor sorted.
  std::vector<int32_t> physical(c.layout.num_blocks);
  for (int32_t i = 0; i < static_cast<int32_t>(physical.size()); ++i) physical[i] = i;
  std::shuffle(physical.begin(), physical.end(), rng);

  const int64_t num_seqs = static_cast<int64_t>(seqs.size());
  const int64_t row = options.num_kv_heads * options.head_dim;
  c.block_tables.assign(num_seqs * c.max_blocks_per_seq, -1);
  c.query_start_loc.push_back(0);
  int64_t next_block = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const SeqSpec& spec = seqs[s];
    int32_t* table = c.block_tables.data() + s * c.max_blocks_per_seq;
    std::vector<int64_t> slots(spec.seq_len);
    for (int64_t pos = 0; pos < spec.seq_len; ++pos) {
      if (pos % bs == 0) table[pos / bs] = physical[next_block++];
      slots[pos] = int64_t{table[pos / bs]} * bs + pos % bs;
    }
    for (int64_t layer = 0; layer < options.num_layers; ++layer) {
      std::vector<float> k = RandomNormal(rng, spec.seq_len * row, options.kv_stddev);
      std::vector<float> v = RandomNormal(rng, spec.seq_len * row, options.kv_stddev);
      const absl::Status status =
          cpu::ReshapeAndCache(k.data(), v.data(), slots.data(), spec.seq_len, layer, c.View());
      EXPECT_TRUE(status.ok()) << status;
      if (layer == options.layer) {
        c.k.push_back(std::move(k));
        c.v.push_back(std::move(v));
      }
    }
    c.seq_lens.push_back(static_cast<int32_t>(spec.seq_len));
    c.query_start_loc.push_back(static_cast<int32_t>(c.query_start_loc.back() + spec.q_len));
  }
  c.num_tokens = c.query_start_loc.back();
  c.q = RandomNormal(rng, c.num_tokens * options.num_q_heads * options.head_dim, options.q_stddev);
  return c;
}

PagedCase MakeDcpShardCase(std::mt19937& rng, const PagedCase& global, const DcpShard& dcp) {
  PagedCase c;
  c.options = global.options;
  c.seqs = global.seqs;
  c.k = global.k;
  c.v = global.v;
  c.q = global.q;
  c.query_start_loc = global.query_start_loc;
  c.seq_lens = global.seq_lens;
  c.num_tokens = global.num_tokens;
  const CaseOptions& options = global.options;
  const int64_t bs = options.block_size;
  int64_t blocks_needed = 0;
  for (const SeqSpec& s : global.seqs) {
    const int64_t local = DcpLocalCount(s.seq_len, dcp);
    c.local_seq_lens.push_back(static_cast<int32_t>(local));
    blocks_needed += (local + bs - 1) / bs;
    c.max_blocks_per_seq = std::max(c.max_blocks_per_seq, (local + bs - 1) / bs);
  }
  c.max_blocks_per_seq += options.spare_table_columns;
  c.layout = {.num_blocks = blocks_needed + options.spare_blocks,
              .num_layers = options.num_layers,
              .block_size = bs,
              .num_kv_heads = options.num_kv_heads,
              .head_dim = options.head_dim};
  // Every layer but options.layer stays NaN, like the slots no sequence owns.
  c.pool.assign(c.layout.TotalElems(), std::numeric_limits<float>::quiet_NaN());
  std::vector<int32_t> physical(c.layout.num_blocks);
  for (int32_t i = 0; i < static_cast<int32_t>(physical.size()); ++i) physical[i] = i;
  std::shuffle(physical.begin(), physical.end(), rng);

  const int64_t row = options.num_kv_heads * options.head_dim;
  c.block_tables.assign(c.seqs.size() * c.max_blocks_per_seq, -1);
  int64_t next_block = 0;
  for (size_t s = 0; s < c.seqs.size(); ++s) {
    const int64_t local = c.local_seq_lens[s];
    int32_t* table = c.block_tables.data() + s * c.max_blocks_per_seq;
    std::vector<int64_t> slots(local);
    std::vector<float> k(local * row), v(local * row);
    for (int64_t j = 0; j < local; ++j) {
      if (j % bs == 0) table[j / bs] = physical[next_block++];
      slots[j] = int64_t{table[j / bs]} * bs + j % bs;
      const int64_t g = DcpGlobalPos(j, dcp);
      std::copy_n(global.k[s].begin() + g * row, row, k.begin() + j * row);
      std::copy_n(global.v[s].begin() + g * row, row, v.begin() + j * row);
    }
    const absl::Status status =
        cpu::ReshapeAndCache(k.data(), v.data(), slots.data(), local, options.layer, c.View());
    EXPECT_TRUE(status.ok()) << status;
  }
  return c;
}

void ReferenceAttentionSeq(const float* q, const float* k, const float* v, int64_t q_len,
                           int64_t seq_len, int64_t num_q_heads, int64_t num_kv_heads,
                           int64_t head_dim, const AttentionParams& params, int64_t key_begin,
                           int64_t key_end, double* out, double* lse) {
  const int64_t group = num_q_heads / num_kv_heads;
  std::vector<double> scores;
  std::vector<int64_t> keys;  // visible positions of the current query
  for (int64_t j = 0; j < q_len; ++j) {
    const int64_t pos = seq_len - q_len + j;
    int64_t lo = params.window_left >= 0 ? std::max<int64_t>(0, pos - params.window_left) : 0;
    lo = std::max(lo, key_begin);
    const int64_t hi = std::min(pos + 1, key_end);
    keys.clear();
    for (int64_t t = lo; t < hi; ++t) {
      // DCP: only the shard's own keys, picked by the placement rule itself (not the local
      // index arithmetic the kernels use).
      if (params.dcp_size > 1 && (t / params.dcp_interleave) % params.dcp_size != params.dcp_rank) {
        continue;
      }
      keys.push_back(t);
    }
    for (int64_t h = 0; h < num_q_heads; ++h) {
      const int64_t kvh = h / group;
      const float* q_row = q + (j * num_q_heads + h) * head_dim;
      double* o = out + (j * num_q_heads + h) * head_dim;
      std::fill(o, o + head_dim, 0.0);
      if (keys.empty()) {
        lse[j * num_q_heads + h] = -std::numeric_limits<double>::infinity();
        continue;
      }
      scores.assign(keys.size(), 0.0);
      double max_score = -std::numeric_limits<double>::infinity();
      for (size_t i = 0; i < keys.size(); ++i) {
        const float* k_row = k + (keys[i] * num_kv_heads + kvh) * head_dim;
        double dot = 0;
        for (int64_t d = 0; d < head_dim; ++d) dot += double{q_row[d]} * k_row[d];
        double score = dot * params.scale;
        if (params.softcap > 0) score = params.softcap * std::tanh(score / params.softcap);
        scores[i] = score;
        max_score = std::max(max_score, score);
      }
      double sum = 0;
      for (size_t i = 0; i < keys.size(); ++i) {
        const int64_t t = keys[i];
        const double w = std::exp(scores[i] - max_score);
        sum += w;
        const float* v_row = v + (t * num_kv_heads + kvh) * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) o[d] += w * v_row[d];
      }
      for (int64_t d = 0; d < head_dim; ++d) o[d] /= sum;
      lse[j * num_q_heads + h] = max_score + std::log(sum);
    }
  }
}

Reference ReferenceAttention(const PagedCase& c, const AttentionParams& params, int64_t key_begin,
                             int64_t key_end) {
  const int64_t hq = c.options.num_q_heads;
  const int64_t d = c.options.head_dim;
  Reference ref;
  ref.out.assign(c.num_tokens * hq * d, 0.0);
  ref.lse.assign(c.num_tokens * hq, 0.0);
  for (size_t s = 0; s < c.seqs.size(); ++s) {
    const int64_t token = c.query_start_loc[s];
    ReferenceAttentionSeq(c.q.data() + token * hq * d, c.k[s].data(), c.v[s].data(),
                          c.seqs[s].q_len, c.seqs[s].seq_len, hq, c.options.num_kv_heads, d, params,
                          key_begin, key_end, ref.out.data() + token * hq * d,
                          ref.lse.data() + token * hq);
  }
  return ref;
}

::testing::AssertionResult OutClose(const std::vector<float>& actual,
                                    const std::vector<double>& expected, double rel_tol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "size " << actual.size() << " != expected " << expected.size();
  }
  double max_ref = 0;
  for (double e : expected) max_ref = std::max(max_ref, std::abs(e));
  const double tol = rel_tol * (max_ref > 0 ? max_ref : 1.0);
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double err = std::abs(actual[i] - expected[i]);
    if (std::isnan(err)) {
      worst = err;
      worst_i = i;
      break;
    }
    if (err > worst) {
      worst = err;
      worst_i = i;
    }
  }
  if (std::isnan(worst) || worst > tol) {
    return ::testing::AssertionFailure()
           << "max error " << worst << " > tol " << tol << " (rel " << rel_tol << " x max|ref| "
           << max_ref << ") at element " << worst_i << ": got " << actual[worst_i] << ", want "
           << expected[worst_i];
  }
  return ::testing::AssertionSuccess() << "max error " << worst << " <= " << tol;
}

::testing::AssertionResult LseClose(const std::vector<float>& actual,
                                    const std::vector<double>& expected, double tol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "size " << actual.size() << " != expected " << expected.size();
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    const double e = expected[i];
    const double a = actual[i];
    const bool ok = std::isinf(e) ? a == e : std::abs(a - e) <= tol * std::max(1.0, std::abs(e));
    if (!ok) {
      return ::testing::AssertionFailure() << "lse[" << i << "] = " << a << ", want " << e;
    }
  }
  return ::testing::AssertionSuccess();
}

KernelResult RunCpuPagedAttention(PagedCase& c, const AttentionParams& params, ThreadPool* pool) {
  KernelResult r;
  r.out.assign(c.num_tokens * c.options.num_q_heads * c.options.head_dim, 1234.5f);
  r.lse.assign(c.num_tokens * c.options.num_q_heads, 1234.5f);
  const absl::Status status =
      cpu::PagedAttention(c.q.data(), c.options.num_q_heads, c.View(), c.options.layer, c.Batch(),
                          params, r.out.data(), r.lse.data(), pool);
  EXPECT_TRUE(status.ok()) << status;
  return r;
}

}  // namespace tandem::kernels::attention_test
