// RouterMetrics through a real router with fake workers: after N streamed requests the outcome
// counter says N, the TTFT and e2e histograms count N, the inter-token histogram counts the gaps,
// tokens add up, and every worker has a health gauge; a request refused by validation is counted
// with its code.
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "router/testing/router_test_util.h"

namespace tandem::router {
namespace {

bool Has(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

TEST(RouterMetricsTest, CountsRequestsLatenciesAndWorkers) {
  RouterHarness harness;
  harness.AddWorker("m", v1::WORKER_ROLE_MIXED);
  const int n = 3;
  for (int i = 0; i < n; ++i) {
    StreamResult r = harness.Generate(MakeRequest({1, 2, 3, 4}, 5));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  }
  // Over the vocabulary: the orchestrator refuses it before any worker call.
  StreamResult bad = harness.Generate(MakeRequest({1, 99999}, 5));
  EXPECT_FALSE(bad.status.ok());
  const std::string text = harness.server().MetricsText();
  EXPECT_TRUE(Has(text, absl::StrCat("tandem:router_requests_total{outcome=\"ok\"} ", n))) << text;
  EXPECT_TRUE(Has(text, "tandem:router_requests_total{outcome=\"invalid_argument\"} 1")) << text;
  EXPECT_TRUE(Has(text, absl::StrCat("tandem:time_to_first_token_seconds_count ", n))) << text;
  EXPECT_TRUE(Has(text, absl::StrCat("tandem:e2e_request_latency_seconds_count ", n + 1)));
  EXPECT_TRUE(Has(text, absl::StrCat("tandem:generation_tokens_total ", 5 * n))) << text;
  EXPECT_TRUE(Has(text, "tandem:router_requests_in_flight 0"));
  EXPECT_NE(text.find("tandem:worker_healthy{worker_id=\"m\",role=\"WORKER_ROLE_MIXED\"} 1"),
            std::string::npos)
      << text;
  // Inter-token gaps: each stream of 5 tokens in chunks gives (chunks - 1) gaps, at least 0.
  EXPECT_NE(text.find("tandem:inter_token_latency_seconds_count "), std::string::npos);
  // Every request was routed to m, the refused one too (the vocabulary is the worker's: it is
  // checked against the chosen worker).
  EXPECT_TRUE(Has(
      text,
      absl::StrCat("tandem:routing_decisions_total{worker_id=\"m\",role=\"WORKER_ROLE_MIXED\"} ",
                   n + 1)))
      << text;
}

// A P/D pair: each request is one prefill and one decode decision; both workers are healthy.
TEST(RouterMetricsTest, CountsRoutingDecisionsOfAPrefillDecodePair) {
  RouterHarness harness;
  harness.AddWorker("p", v1::WORKER_ROLE_PREFILL);
  harness.AddWorker("d", v1::WORKER_ROLE_DECODE);
  const int n = 4;
  for (int i = 0; i < n; ++i) {
    StreamResult r = harness.Generate(MakeRequest({1, 2, 3, 4}, 5));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  }
  const std::string text = harness.server().MetricsText();
  EXPECT_TRUE(
      Has(text,
          absl::StrCat(
              "tandem:routing_decisions_total{worker_id=\"p\",role=\"WORKER_ROLE_PREFILL\"} ", n)))
      << text;
  EXPECT_TRUE(Has(
      text, absl::StrCat(
                "tandem:routing_decisions_total{worker_id=\"d\",role=\"WORKER_ROLE_DECODE\"} ", n)))
      << text;
  EXPECT_TRUE(Has(text, "tandem:worker_healthy{worker_id=\"p\",role=\"WORKER_ROLE_PREFILL\"} 1"));
  EXPECT_TRUE(Has(text, "tandem:worker_healthy{worker_id=\"d\",role=\"WORKER_ROLE_DECODE\"} 1"));
  EXPECT_EQ(text.find("# TYPE tandem:routing_decisions_total counter"),
            text.rfind("# TYPE tandem:routing_decisions_total counter"))
      << "one TYPE line per family";
  EXPECT_TRUE(Has(text, absl::StrCat("tandem:router_requests_total{outcome=\"ok\"} ", n)));
}

}  // namespace
}  // namespace tandem::router
