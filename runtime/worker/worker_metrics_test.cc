// WorkerMetricsText's mixture-of-experts family: one tandem:moe_expert_tokens_total counter per
// expert (label expert = global id) from WorkerStats.moe_expert_tokens, one HELP/TYPE header, and
// none for a dense model.
#include "runtime/worker/worker_metrics.h"

#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tandem::runtime {
namespace {

std::vector<std::string> Lines(const std::string& text, const std::string& prefix) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) == 0) out.push_back(line);
  }
  return out;
}

TEST(WorkerMetricsTest, OneCounterPerExpert) {
  tandem::v1::WorkerStats stats;
  stats.mutable_info()->set_model_id("moe");
  std::mt19937 rng(3);
  std::vector<uint64_t> counts(6);
  for (uint64_t& n : counts) {
    n = rng() % 100000;
    stats.add_moe_expert_tokens(n);
  }
  const std::string text = WorkerMetricsText(stats, Worker::Latencies{});
  const std::vector<std::string> samples = Lines(text, "tandem:moe_expert_tokens_total{");
  ASSERT_EQ(samples.size(), counts.size());
  for (size_t e = 0; e < counts.size(); ++e) {
    EXPECT_NE(samples[e].find(absl::StrCat("expert=\"", e, "\"")), std::string::npos) << samples[e];
    EXPECT_NE(samples[e].find("model_name=\"moe\""), std::string::npos) << samples[e];
    EXPECT_EQ(std::stod(samples[e].substr(samples[e].rfind(' ') + 1)),
              static_cast<double>(counts[e]));
  }
  EXPECT_EQ(Lines(text, "# TYPE tandem:moe_expert_tokens_total counter").size(), 1u);
  EXPECT_EQ(Lines(text, "# HELP tandem:moe_expert_tokens_total").size(), 1u);
}

TEST(WorkerMetricsTest, DenseModelsHaveNoExpertFamily) {
  tandem::v1::WorkerStats stats;
  const std::string text = WorkerMetricsText(stats, Worker::Latencies{});
  EXPECT_EQ(text.find("moe_expert_tokens"), std::string::npos);
}

}  // namespace
}  // namespace tandem::runtime
