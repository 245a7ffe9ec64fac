#include "kernels/mla/mla_prefill_select.h"

#include <algorithm>

#include "kernels/mla/mla_attention.h"

namespace tandem::kernels {
namespace {

double Triples(const MlaStepBounds& b) {
  return MlaVisiblePairs(b) * static_cast<double>(b.num_heads);
}

}  // namespace

MlaFormCosts MeasuredMlaFormCosts() {
  // Weighted least squares (relative error) over BENCHMARKS.md's 32 shapes (kernels/mla
  // mla_prefill_cuda_bench, nvidia-h200): the winner matches wherever the two forms differ by
  // more than 15% (mla_prefill_select_test).
  return {.absorbed_per_triple = 0.004388,
          .absorbed_per_token_head = 2.262,
          .absorbed_fixed = 28940.0,
          .unabsorbed_per_triple = 0.003282,
          .unabsorbed_per_triple_reads = 0.009610,
          .unabsorbed_fixed = 27380.0,
          .unabsorbed_ctas_per_sm = 3};
}

double MlaVisiblePairs(const MlaStepBounds& b) {
  if (b.num_seqs <= 0 || b.num_tokens <= 0) return 0.0;
  const double q = static_cast<double>(b.num_tokens) / static_cast<double>(b.num_seqs);
  return static_cast<double>(b.num_tokens) * (static_cast<double>(b.max_seq_len) - (q - 1.0) / 2.0);
}

int64_t MlaUnabsorbedContextRows(const MlaStepBounds& b) { return b.num_seqs * b.max_seq_len; }

double MlaAbsorbedNs(const MlaStepBounds& b, const MlaFormCosts& c) {
  return Triples(b) * c.absorbed_per_triple +
         static_cast<double>(b.num_tokens * b.num_heads) * c.absorbed_per_token_head +
         c.absorbed_fixed;
}

double MlaUnabsorbedNs(const MlaStepBounds& b, const MlaFormCosts& c) {
  // 64-row work items (token x head) of the prefill kernel, per request at the mean query length.
  const int64_t mean_q = (b.num_tokens + b.num_seqs - 1) / std::max<int64_t>(b.num_seqs, 1);
  const double items =
      static_cast<double>(std::max<int64_t>(1, b.num_seqs * ((mean_q * b.num_heads + 63) / 64)));
  const double slots =
      static_cast<double>(std::max<int64_t>(1, b.num_sms * c.unabsorbed_ctas_per_sm));
  const double tri = Triples(b);
  return tri * c.unabsorbed_per_triple * std::max(1.0, slots / items) +
         tri * c.unabsorbed_per_triple_reads * static_cast<double>(b.num_heads) /
             std::min(items, slots) +
         c.unabsorbed_fixed;
}

bool PreferUnabsorbedMla(const MlaStepBounds& b, const MlaFormCosts& costs) {
  if (b.num_seqs <= 0 || b.num_tokens <= 0 || b.num_heads <= 0 || b.max_seq_len <= 0) return false;
  // Decode and speculative verification rows stay absorbed whatever the estimate of a batch.
  if (b.num_tokens <= b.num_seqs * kMlaAbsorbMaxQueryLen) return false;
  return MlaUnabsorbedNs(b, costs) < MlaAbsorbedNs(b, costs);
}

}  // namespace tandem::kernels
