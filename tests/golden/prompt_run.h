// All of a golden's prompts in one continuous batch through a CPU engine, one token each: the
// last prompt position's logits and the first greedy token (fp8_golden_test,
// fp8_deepseek_golden_test).
#ifndef TANDEM_TESTS_GOLDEN_PROMPT_RUN_H_
#define TANDEM_TESTS_GOLDEN_PROMPT_RUN_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/engine/engine.h"

namespace tandem::runtime {

struct PromptRun {
  std::vector<std::vector<float>> logits;  // last prompt position
  std::vector<int32_t> first;              // first greedy token (-1: none)
};

// n prompts with no logits and no token yet (what a run that could not start returns).
inline PromptRun EmptyPromptRun(size_t n) {
  return PromptRun{std::vector<std::vector<float>>(n), std::vector<int32_t>(n, -1)};
}

inline PromptRun RunPromptsOnce(Engine& engine, const std::vector<std::vector<int32_t>>& prompts) {
  PromptRun run = EmptyPromptRun(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestSpec spec;
    spec.prompt = prompts[i];
    spec.max_tokens = 1;
    spec.ignore_eos = true;
    spec.capture_last_prompt_logits = true;
    EXPECT_TRUE(engine.AddRequest(static_cast<int64_t>(i), spec).ok());
  }
  while (engine.HasUnfinished()) {
    auto updates = engine.Step();
    EXPECT_TRUE(updates.ok()) << updates.status();
    if (!updates.ok()) break;
    for (RequestUpdate& u : *updates) {
      if (!u.last_prompt_logits.empty()) run.logits[u.request_id] = std::move(u.last_prompt_logits);
      if (!u.new_token_ids.empty() && run.first[u.request_id] < 0) {
        run.first[u.request_id] = u.new_token_ids[0];
      }
    }
  }
  return run;
}

}  // namespace tandem::runtime

#endif  // TANDEM_TESTS_GOLDEN_PROMPT_RUN_H_
