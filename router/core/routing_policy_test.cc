#include "router/core/routing_policy.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::router {
namespace {

RouteCandidate C(std::string id, v1::WorkerRole role, int64_t cached = 0, int64_t load = 0,
                 int64_t free_blocks = 0, std::string model = "m", uint64_t layout = 1) {
  RouteCandidate c;
  c.worker_id = std::move(id);
  c.role = role;
  c.cached_tokens = cached;
  c.load = load;
  c.free_blocks = free_blocks;
  c.model_id = std::move(model);
  c.kv_layout_hash = layout;
  return c;
}

constexpr auto P = v1::WORKER_ROLE_PREFILL;
constexpr auto D = v1::WORKER_ROLE_DECODE;
constexpr auto M = v1::WORKER_ROLE_MIXED;

TEST(RoutingPolicyTest, PrefillByCachedPrefixThenLoadThenId) {
  std::vector<RouteCandidate> c = {C("p-b", P, 32, 9), C("p-a", P, 32, 9), C("p-c", P, 16, 0),
                                   C("d", D, 0, 0, 10)};
  auto plan = ChooseRoute(c);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->prefill_worker, "p-a");
  c[0].load = 1;
  EXPECT_EQ(ChooseRoute(c)->prefill_worker, "p-b");
  c[2].cached_tokens = 48;
  EXPECT_EQ(ChooseRoute(c)->prefill_worker, "p-c");
}

TEST(RoutingPolicyTest, DecodeByFreeBlocksThenLoad) {
  std::vector<RouteCandidate> c = {C("p", P), C("d0", D, 0, 5, 100), C("d1", D, 0, 9, 300),
                                   C("d2", D, 0, 1, 300)};
  EXPECT_EQ(ChooseRoute(c)->decode_worker, "d2");
  c[3].free_blocks = 299;
  EXPECT_EQ(ChooseRoute(c)->decode_worker, "d1");
}

TEST(RoutingPolicyTest, PairsOnlyTheSameModelAndLayout) {
  std::vector<RouteCandidate> c = {C("p-a", P, 100, 0, 0, "A", 1), C("p-b", P, 0, 5, 0, "B", 2),
                                   C("d-a2", D, 0, 0, 1000, "A", 2), C("d-b", D, 0, 0, 10, "B", 2)};
  // p-a has the better prefix but no decode worker of its kind: p-b/d-b serve.
  auto plan = ChooseRoute(c);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->prefill_worker, "p-b");
  EXPECT_EQ(plan->decode_worker, "d-b");
  EXPECT_EQ(ChooseDecode(c, "A", 1, {}), std::nullopt);
  EXPECT_EQ(ChooseDecode(c, "A", 2, {}), "d-a2");
  EXPECT_EQ(ChooseDecode(c, "A", 2, {"d-a2"}), std::nullopt);
}

TEST(RoutingPolicyTest, MixedOnlyWithoutAPair) {
  std::vector<RouteCandidate> c = {C("m0", M, 0, 3), C("m1", M, 16, 7), C("p", P)};
  auto plan = ChooseRoute(c);
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(plan->disaggregated());
  EXPECT_EQ(plan->mixed_worker, "m1");
  c.push_back(C("d", D));
  plan = ChooseRoute(c);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->disaggregated());
  EXPECT_TRUE(plan->mixed_worker.empty());
}

TEST(RoutingPolicyTest, NothingToRouteIsUnavailable) {
  EXPECT_EQ(ChooseRoute({}).status().code(), absl::StatusCode::kUnavailable);
  std::vector<RouteCandidate> c = {C("p", P, 0, 0, 0, "A"), C("d", D, 0, 0, 0, "B")};
  auto plan = ChooseRoute(c);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(plan.status().message().find("none compatible"), std::string::npos);
}

// An FP8-latent P and an f32 D (different layout hashes) never pair; the message names both
// sides' KV dtypes (and "?" for a worker that stated none).
TEST(RoutingPolicyTest, NoneCompatibleNamesBothSidesKvDtypes) {
  std::vector<RouteCandidate> c = {C("p", P, 0, 0, 0, "m", 7), C("d", D, 0, 0, 0, "m", 8)};
  c[0].kv_dtype = "KV_DTYPE_FP8_E4M3";
  c[1].kv_dtype = "KV_DTYPE_F32";
  absl::StatusOr<RoutePlan> plan = ChooseRoute(c);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(plan.status().message().find("prefill KV dtypes {KV_DTYPE_FP8_E4M3}, decode KV dtypes "
                                         "{KV_DTYPE_F32}"),
            std::string::npos)
      << plan.status();
  c.push_back(C("p2", P, 0, 0, 0, "m", 9));
  plan = ChooseRoute(c);
  EXPECT_NE(plan.status().message().find("prefill KV dtypes {?, KV_DTYPE_FP8_E4M3}"),
            std::string::npos)
      << plan.status();
}

}  // namespace
}  // namespace tandem::router
