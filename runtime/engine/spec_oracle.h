// A benchmark-only drafter that is right by construction (issue 34's "synthetic drafter"): it
// proposes a request's known continuation, each draft corrupted (replaced by another token) with
// a chosen probability, so that the verifier can be measured at a chosen acceptance without
// trained draft weights. Greedy decoding is exact, so a first plain run of the same requests
// gives the continuation (SetReference); the engine then runs with method kNgram and this hook
// (SpeculativeConfig::bench_hook). Not a --speculative_method: no flag or worker option reaches
// it; spec_oracle_bench.cc and spec_oracle_test.cc use it.
//
// Corruption is drawn per draft from a hash of (seed, request, pass start, draft index), so runs
// repeat exactly and drafts of different passes are independent. With per-draft corruption rate
// p and K drafts a pass accepts its leading uncorrupted drafts: the acceptance rate (accepted /
// drafted) is sum_{i=1..K} (1 - p)^i / K (ExpectedAcceptance).
//
// A request whose tokens leave its reference (on a GPU, bf16 results depend on the step's shape,
// so a verify pass can pick another token than the plain run did) gets no drafts from there on
// (plain steps, counted in diverged()); at rate 1 it keeps getting random drafts instead, so a
// run at rate 1 verifies K drafts at every step whatever its reference: its output is the
// verifier's own greedy sequence at that width, the reference that a GPU run at the same K then
// follows (spec_oracle_bench.cc).
//
// Thread safety: not thread-safe; configure between runs, the engine calls it on one thread.
#ifndef TANDEM_RUNTIME_ENGINE_SPEC_ORACLE_H_
#define TANDEM_RUNTIME_ENGINE_SPEC_ORACLE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/types/span.h"
#include "runtime/engine/speculative.h"

namespace tandem::runtime {

// sum_{i=1..k} (1 - p)^i / k: the acceptance rate of k drafts each corrupted with probability p.
double ExpectedAcceptance(double corrupt_rate, int64_t k);
// The corruption rate p in [0, 1] with ExpectedAcceptance(p, k) == acceptance (bisection).
double CorruptRateForAcceptance(double acceptance, int64_t k);

class OracleDrafter : public BenchDraftHook {
 public:
  // Token ids are drawn in [0, vocab_size). REQUIRES: vocab_size >= 2.
  OracleDrafter(int64_t vocab_size, uint64_t seed);

  // The whole expected sequence (prompt + output) of `request_id`; replaces any earlier one.
  void SetReference(int64_t request_id, std::vector<int32_t> tokens);
  void ClearReferences();
  // Drafts per pass (0: none, every step plain) and the per-draft corruption rate in [0, 1].
  void Configure(int64_t max_drafts, double corrupt_rate);
  // Requests whose tokens left their reference since the last ClearDiverged().
  int64_t diverged() const { return static_cast<int64_t>(diverged_.size()); }
  void ClearDiverged() { diverged_.clear(); }

  int64_t MaxDrafts(int64_t request_id) const override;
  std::optional<std::vector<int32_t>> Draft(int64_t request_id, absl::Span<const int32_t> tokens,
                                            int64_t max_tokens) const override;

 private:
  // 0: draft `index` of the pass starting at `start` is the reference token; else the id shift
  // (1 .. vocab_size - 1) that corrupts it.
  int64_t Corruption(int64_t request_id, int64_t start, int64_t index) const;

  const int64_t vocab_size_;
  const uint64_t seed_;
  int64_t max_drafts_ = 0;
  double corrupt_rate_ = 0;
  absl::flat_hash_map<int64_t, std::vector<int32_t>> references_;
  mutable absl::flat_hash_set<int64_t> diverged_;  // Draft() records them
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_ENGINE_SPEC_ORACLE_H_
