// Which form a CUDA MLA step runs in, absorbed (MlaAbsorbedAttention) or unabsorbed
// (MlaUnabsorbedAttention), from the step's host-known bounds: a cost model of both forms fitted
// to the H200 measurements of BENCHMARKS.md ("Prefill: absorbed vs unabsorbed", 32 shapes).
//
// Absorbed: a cost per visible (query token, key, head) triple (the wgmma latent kernel, ~480
// TFLOP/s of its 2 x 1088 flops per triple), per (token, head) (the W_UK / W_UV GEMMs), plus a
// fixed cost. Unabsorbed: a smaller cost per triple (2 x 320 flops) on the mma.sync prefill kernel,
// which has no split-KV: with fewer 64-row work items than CTA slots (3 per SM at head_dim 192)
// the per-triple time grows by slots / items; and a K/V-read term that grows with Hq / items (the
// K/V rows of a head are shared by fewer concurrent tiles at 128 heads than at 16), plus a fixed
// cost. The up-projection GEMMs fitted to ~0 against these terms. The result: unabsorbed wins
// prefills with no or a short prefix (the absorbed kernel loses most under the causal triangle),
// absorbed wins decode, verification and every chunk over a long prefix.
//
// Thread safety: pure functions.
#ifndef TANDEM_KERNELS_MLA_MLA_PREFILL_SELECT_H_
#define TANDEM_KERNELS_MLA_MLA_PREFILL_SELECT_H_

#include <cstdint>

namespace tandem::kernels {

// A step's bounds as the CUDA model knows them on the host.
struct MlaStepBounds {
  int64_t num_heads = 0;  // Hq of this rank
  int64_t num_seqs = 0;
  int64_t num_tokens = 0;   // new tokens of the step
  int64_t max_seq_len = 0;  // longest context (prefix + new tokens)
  int64_t num_sms = 132;    // the device's (the fit's: an H200)
};

// Nanoseconds (H200, bf16, DeepSeek widths: nope 128, rope 64, latent 512, v 128).
struct MlaFormCosts {
  double absorbed_per_triple = 0.0;
  double absorbed_per_token_head = 0.0;
  double absorbed_fixed = 0.0;
  double unabsorbed_per_triple = 0.0;        // times max(1, slots / items)
  double unabsorbed_per_triple_reads = 0.0;  // times Hq / min(items, slots)
  double unabsorbed_fixed = 0.0;
  int64_t unabsorbed_ctas_per_sm = 3;  // the prefill kernel's at head_dim 192
};
MlaFormCosts MeasuredMlaFormCosts();

// Visible (query token, key) pairs: exact for one request (q new tokens over a context of
// max_seq_len: q * (ctx - (q - 1) / 2)), an over-estimate for a batch of unequal requests (every
// request taken at the mean query length and the longest context).
double MlaVisiblePairs(const MlaStepBounds& b);

// The unabsorbed form's context rows: num_seqs * max_seq_len (what the model's plan bounds the
// up-projection GEMMs by).
int64_t MlaUnabsorbedContextRows(const MlaStepBounds& b);

// The model's estimates of the two forms' times, in nanoseconds.
double MlaAbsorbedNs(const MlaStepBounds& b, const MlaFormCosts& costs);
double MlaUnabsorbedNs(const MlaStepBounds& b, const MlaFormCosts& costs);

// True when the unabsorbed form is estimated faster. False for empty steps and for steps of at
// most kMlaAbsorbMaxQueryLen new tokens per request (decode, speculative verification).
bool PreferUnabsorbedMla(const MlaStepBounds& b,
                         const MlaFormCosts& costs = MeasuredMlaFormCosts());

}  // namespace tandem::kernels

#endif  // TANDEM_KERNELS_MLA_MLA_PREFILL_SELECT_H_
