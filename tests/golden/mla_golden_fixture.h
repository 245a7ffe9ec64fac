// The MLA golden fixtures' expected.json (make_golden_mla.py), read the one way the MLA goldens
// (mla_golden_test, fp8_kv_golden_test) share; LoadGoldenAt reads make_golden.py's too.
#ifndef TANDEM_TESTS_GOLDEN_MLA_GOLDEN_FIXTURE_H_
#define TANDEM_TESTS_GOLDEN_MLA_GOLDEN_FIXTURE_H_

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::runtime {

inline constexpr char kFixtures[] = "tests/golden/fixtures_mla/";

struct Golden {
  std::vector<std::vector<int32_t>> prompts, greedy;
  std::vector<std::vector<float>> logits;
  std::vector<int> prefix_pair;
  int max_new_tokens = 0;
};

// The expected.json of the fixture directory `dir` (any golden fixture of make_golden.py's form).
inline Golden LoadGoldenAt(const std::string& dir) {
  std::ifstream in(dir + "/expected.json");
  EXPECT_TRUE(in.good()) << dir;
  const nlohmann::json j = nlohmann::json::parse(in);
  Golden g;
  g.prompts = j["prompts"].get<std::vector<std::vector<int32_t>>>();
  g.greedy = j["greedy_tokens"].get<std::vector<std::vector<int32_t>>>();
  g.logits = j["last_prompt_logits"].get<std::vector<std::vector<float>>>();
  g.prefix_pair = j["prefix_pair"]["indices"].get<std::vector<int>>();
  g.max_new_tokens = j["max_new_tokens"];
  return g;
}

inline Golden LoadGolden(const std::string& variant) { return LoadGoldenAt(kFixtures + variant); }

// One request's generated tokens and last-prompt logits.
struct Output {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
};

}  // namespace tandem::runtime

#endif  // TANDEM_TESTS_GOLDEN_MLA_GOLDEN_FIXTURE_H_
