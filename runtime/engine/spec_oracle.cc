#include "runtime/engine/spec_oracle.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/sampling/philox.h"

namespace tandem::runtime {

double ExpectedAcceptance(double corrupt_rate, int64_t k) {
  if (k <= 0) return 0;
  const double q = 1.0 - corrupt_rate;
  double sum = 0, term = 1;
  for (int64_t i = 1; i <= k; ++i) {
    term *= q;
    sum += term;
  }
  return sum / static_cast<double>(k);
}

double CorruptRateForAcceptance(double acceptance, int64_t k) {
  double lo = 0, hi = 1;  // ExpectedAcceptance falls from 1 at p = 0 to 0 at p = 1
  for (int i = 0; i < 60; ++i) {
    const double mid = 0.5 * (lo + hi);
    (ExpectedAcceptance(mid, k) > acceptance ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

OracleDrafter::OracleDrafter(int64_t vocab_size, uint64_t seed)
    : vocab_size_(vocab_size), seed_(seed) {}

void OracleDrafter::SetReference(int64_t request_id, std::vector<int32_t> tokens) {
  references_[request_id] = std::move(tokens);
}

void OracleDrafter::ClearReferences() { references_.clear(); }

void OracleDrafter::Configure(int64_t max_drafts, double corrupt_rate) {
  max_drafts_ = max_drafts;
  corrupt_rate_ = std::clamp(corrupt_rate, 0.0, 1.0);
}

int64_t OracleDrafter::MaxDrafts(int64_t /*request_id*/) const { return max_drafts_; }

int64_t OracleDrafter::Corruption(int64_t request_id, int64_t start, int64_t index) const {
  if (corrupt_rate_ <= 0) return 0;
  // One Philox draw keyed by the request, counter (pass start, draft index).
  const uint64_t key = seed_ ^ (static_cast<uint64_t>(request_id) * 0x9e3779b97f4a7c15ull);
  const kernels::PhiloxOutput r = kernels::Philox4x32_10(
      kernels::PhiloxCounter{{static_cast<uint32_t>(start), static_cast<uint32_t>(start >> 32),
                              static_cast<uint32_t>(index), 0u}},
      kernels::PhiloxKeyFromSeed(key));
  if (kernels::UniformDouble(r.x[0], r.x[1]) >= corrupt_rate_) return 0;
  return 1 + static_cast<int64_t>(r.x[2] % static_cast<uint64_t>(vocab_size_ - 1));
}

std::optional<std::vector<int32_t>> OracleDrafter::Draft(int64_t request_id,
                                                         absl::Span<const int32_t> tokens,
                                                         int64_t max_tokens) const {
  std::vector<int32_t> drafts;
  auto it = references_.find(request_id);
  const int64_t start = static_cast<int64_t>(tokens.size());
  if (it == references_.end() || start > static_cast<int64_t>(it->second.size()) ||
      !std::equal(tokens.begin(), tokens.end(), it->second.begin())) {
    if (it != references_.end()) diverged_.insert(request_id);
    // Off the reference: no drafts, except at rate 1, where any draft is as good as a corrupted
    // one: ids drawn like corruptions of the last token (rejected but for a chance match).
    if (corrupt_rate_ < 1 || tokens.empty()) return drafts;
    for (int64_t i = 0; i < max_tokens; ++i) {
      const int64_t shift = Corruption(request_id, start, i);
      drafts.push_back(static_cast<int32_t>((tokens.back() + shift) % vocab_size_));
    }
    return drafts;
  }
  const std::vector<int32_t>& ref = it->second;
  const int64_t n = std::min(max_tokens, static_cast<int64_t>(ref.size()) - start);
  for (int64_t i = 0; i < n; ++i) {
    // A corrupted draft is another id, uniform over the rest of the vocabulary.
    const int64_t shift = Corruption(request_id, start, i);
    drafts.push_back(static_cast<int32_t>((ref[start + i] + shift) % vocab_size_));
  }
  return drafts;
}

}  // namespace tandem::runtime
