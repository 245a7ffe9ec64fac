// The transformers reference of the FP8 goldens (fixture expected.json): prompts, the logits at
// each prompt's last token, the top-2 gap there and the first greedy token; `suffix` picks a
// second reference in the same file (e.g. "_act_quant": activations quantized per token).
// Header-only, testonly (listed in the srcs of the tests that use it).
#ifndef TANDEM_TESTS_GOLDEN_GAP_GOLDEN_H_
#define TANDEM_TESTS_GOLDEN_GAP_GOLDEN_H_

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::golden {

struct GapGolden {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<float>> logits;
  std::vector<float> gaps;
  std::vector<int32_t> first_tokens;
};

inline GapGolden LoadGapGolden(const std::string& dir, const std::string& suffix = "") {
  std::ifstream in(dir + "/expected.json");
  EXPECT_TRUE(in.good()) << dir;
  const nlohmann::json j = nlohmann::json::parse(in);
  GapGolden g;
  g.prompts = j["prompts"].get<std::vector<std::vector<int32_t>>>();
  g.logits = j["last_prompt_logits" + suffix].get<std::vector<std::vector<float>>>();
  g.gaps = j["top2_gap" + suffix].get<std::vector<float>>();
  for (const auto& tokens : j["greedy_tokens" + suffix]) g.first_tokens.push_back(tokens[0]);
  return g;
}

}  // namespace tandem::golden

#endif  // TANDEM_TESTS_GOLDEN_GAP_GOLDEN_H_
