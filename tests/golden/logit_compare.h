// Shared by the golden tests (golden_test, fp8_golden_test): how a run's logits are compared with
// a reference's (their scale, top token and cosine).
#ifndef TANDEM_TESTS_GOLDEN_LOGIT_COMPARE_H_
#define TANDEM_TESTS_GOLDEN_LOGIT_COMPARE_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace tandem::golden {

inline float MaxAbs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

inline int ArgMax(const std::vector<float>& v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Cosine of two vectors of the same length, summed in double.
inline double Cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += double{a[i]} * b[i];
    aa += double{a[i]} * a[i];
    bb += double{b[i]} * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

}  // namespace tandem::golden

#endif  // TANDEM_TESTS_GOLDEN_LOGIT_COMPARE_H_
