// Prefill/decode disaggregation at the engine level: a P engine and a D engine in one process,
// joined by PullKvConnectors over InProcessAgents (the same connector code the worker daemons
// run over UCX). P prefills and holds the KV under a lease; D loads it and decodes. Outputs must
// equal one mixed engine's token for token (greedy and seeded sampling), with every block back
// in both pools; load failures recompute or fail per policy; leases expire; aborts and
// deadlines during a load never free blocks a transfer may still write.
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kvtransfer/inprocess/inprocess_agent.h"
#include "kvtransfer/pull_connector.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/engine_test_util.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime {
namespace {

using kvtransfer::InProcessAgent;
using kvtransfer::InProcessFabric;
using kvtransfer::PullKvConnector;

constexpr uint64_t kWeightSeed = 77;

using engine_test::TinyConfig;

EngineConfig SmallEngine() {
  EngineConfig config;
  config.block_size = 16;
  config.kv_cache_bytes = int64_t{8} << 20;
  config.num_threads = 1;
  return config;
}

// One worker: engine + agent + connector.
struct Node {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<InProcessAgent> agent;
  std::unique_ptr<PullKvConnector> connector;
};

Node MakeNode(std::shared_ptr<InProcessFabric> fabric, const std::string& name) {
  Node node;
  const ModelConfig model = TinyConfig();
  auto engine = Engine::Create(SmallEngine(), model, RandomModelWeights(model, kWeightSeed));
  EXPECT_TRUE(engine.ok()) << engine.status();
  node.engine = std::move(*engine);
  node.agent = std::make_unique<InProcessAgent>(fabric, name);
  EXPECT_TRUE(node.agent
                  ->RegisterMemory(node.engine->kv_pool_data(), node.engine->kv_pool_bytes(),
                                   tandem::v1::MEMORY_KIND_HOST)
                  .ok());
  kvtransfer::PullKvConnectorOptions options;
  options.block_size = node.engine->block_size();
  options.block_bytes = node.engine->kv_block_bytes();
  node.connector = std::make_unique<PullKvConnector>(node.agent.get(), options);
  node.engine->AttachConnector(node.connector.get());
  return node;
}

void Connect(Node& reader, Node& source, const std::string& source_name) {
  tandem::v1::TransferHandshake hs;
  ASSERT_TRUE(source.agent->FillLocalDescriptor(&hs).ok());
  ASSERT_TRUE(reader.agent->AddPeer(source_name, hs).ok());
}

struct Outcome {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kNone;
  absl::Status error;
  std::optional<RequestUpdate::Lease> lease;
};

// Steps `engine` until it has no work; returns the updates per request id. A step that produced
// nothing (a KV load still copying on the agent's thread) yields briefly; the hang guard is
// time, not steps, so a loaded CI machine that schedules the copy thread late does not end the
// loop early.
std::map<int64_t, Outcome> Drain(Engine& engine) {
  std::map<int64_t, Outcome> out;
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (engine.HasWork() && absl::Now() < give_up) {
    auto updates = engine.Step();
    EXPECT_TRUE(updates.ok()) << updates.status();
    if (!updates.ok()) break;
    if (updates->empty()) absl::SleepFor(absl::Microseconds(50));
    for (RequestUpdate& u : *updates) {
      Outcome& o = out[u.request_id];
      o.tokens.insert(o.tokens.end(), u.new_token_ids.begin(), u.new_token_ids.end());
      if (u.finish_reason != FinishReason::kNone) o.reason = u.finish_reason;
      if (!u.error.ok()) o.error = u.error;
      if (u.kv_lease.has_value()) o.lease = std::move(u.kv_lease);
    }
  }
  EXPECT_FALSE(engine.HasWork());
  return out;
}

std::vector<RequestSpec> RandomSpecs(uint32_t seed, int n) {
  std::mt19937 rng(seed);
  std::vector<RequestSpec> specs;
  for (int i = 0; i < n; ++i) {
    RequestSpec spec;
    // Lengths around block multiples: partial last blocks and exact fits.
    const int len = 1 + static_cast<int>(rng() % 64);
    for (int t = 0; t < len; ++t) spec.prompt.push_back(static_cast<int32_t>(rng() % 256));
    spec.max_tokens = 2 + static_cast<int>(rng() % 10);
    spec.ignore_eos = true;
    if (i % 3 == 2) {  // seeded sampling must survive the handoff too
      spec.sampling.temperature = 0.8f;
      spec.sampling.top_k = 20;
      spec.sampling.seed = rng();
    }
    specs.push_back(std::move(spec));
  }
  return specs;
}

std::map<int64_t, Outcome> RunMixed(const std::vector<RequestSpec>& specs) {
  const ModelConfig model = TinyConfig();
  auto engine = Engine::Create(SmallEngine(), model, RandomModelWeights(model, kWeightSeed));
  EXPECT_TRUE(engine.ok());
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_TRUE((*engine)->AddRequest(static_cast<int64_t>(i), specs[i]).ok());
  }
  return Drain(**engine);
}

// P side: prefill with a lease; returns first tokens + leases.
std::map<int64_t, Outcome> RunPrefill(Node& p, const std::vector<RequestSpec>& specs,
                                      absl::Duration lease = absl::Seconds(30)) {
  for (size_t i = 0; i < specs.size(); ++i) {
    RequestSpec spec = specs[i];
    spec.max_tokens = 1;
    spec.hold_kv_for_remote = true;
    spec.lease_duration = lease;
    EXPECT_TRUE(p.engine->AddRequest(static_cast<int64_t>(i), spec).ok());
  }
  return Drain(*p.engine);
}

RequestSpec DecodeSpec(const RequestSpec& original, const Outcome& prefill,
                       const std::string& peer) {
  RequestSpec spec = original;
  spec.first_token = prefill.tokens.at(0);
  kvtransfer::RemoteKvSpec remote;
  remote.peer = peer;
  remote.block_ids = prefill.lease->block_ids;
  remote.num_tokens = prefill.lease->num_tokens;
  remote.lease_id = prefill.lease->lease.lease_id;
  spec.remote_kv = remote;
  return spec;
}

void ExpectAllBlocksFree(Engine& engine) {
  EXPECT_EQ(engine.kv_cache_stats().num_free_blocks, engine.num_kv_blocks());
}

TEST(DisaggEngineTest, PrefillThenDecodeEqualsMixedEngine) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  const std::vector<RequestSpec> specs = RandomSpecs(seed, 12);
  const auto mixed = RunMixed(specs);

  auto fabric = std::make_shared<InProcessFabric>();
  Node p = MakeNode(fabric, "p"), d = MakeNode(fabric, "d");
  Connect(d, p, "p");
  auto prefilled = RunPrefill(p, specs);
  ASSERT_EQ(prefilled.size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const Outcome& o = prefilled[i];
    ASSERT_EQ(o.tokens.size(), 1u);
    EXPECT_EQ(o.reason, FinishReason::kLength);
    ASSERT_TRUE(o.lease.has_value()) << "prompt " << i;
    EXPECT_EQ(o.lease->num_tokens, static_cast<int64_t>(specs[i].prompt.size()));
    ASSERT_TRUE(d.engine->AddRequest(static_cast<int64_t>(i), DecodeSpec(specs[i], o, "p")).ok());
  }
  EXPECT_EQ(p.connector->Stats().leases_active, specs.size());
  EXPECT_LT(p.engine->kv_cache_stats().num_free_blocks, p.engine->num_kv_blocks());

  auto decoded = Drain(*d.engine);
  for (size_t i = 0; i < specs.size(); ++i) {
    std::vector<int32_t> joined = {prefilled[i].tokens[0]};
    joined.insert(joined.end(), decoded[i].tokens.begin(), decoded[i].tokens.end());
    EXPECT_EQ(joined, mixed.at(i).tokens) << "prompt " << i;
    EXPECT_EQ(decoded[i].reason, mixed.at(i).reason);
    ASSERT_TRUE(p.connector->ReleaseLease(prefilled[i].lease->lease.lease_id));
    EXPECT_FALSE(p.connector->ReleaseLease(prefilled[i].lease->lease.lease_id)) << "twice";
  }
  EXPECT_EQ(d.connector->Stats().loads_completed, specs.size());
  EXPECT_EQ(d.connector->Stats().load_failures, 0u);
  Drain(*p.engine);  // picks up the released leases
  p.engine->Step().IgnoreError();
  ExpectAllBlocksFree(*p.engine);
  ExpectAllBlocksFree(*d.engine);
  EXPECT_EQ(p.connector->Stats().leases_released, specs.size());
  EXPECT_EQ(p.connector->Stats().blocks_leased, 0u);
  // One duration per completed load (the workers' tandem:kv_transfer_duration_seconds).
  const kvtransfer::KvConnectorStats loaded = d.connector->Stats();
  EXPECT_EQ(loaded.loads_completed, specs.size());
  EXPECT_EQ(loaded.load_seconds.count, loaded.loads_completed);
  EXPECT_NEAR(loaded.load_seconds.sum, loaded.load_micros / 1e6, 1e-3);
  EXPECT_EQ(d.engine->num_kv_recomputes(), 0u);
}

TEST(DisaggEngineTest, DecodeSkipsBlocksItsPrefixCacheHolds) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  RequestSpec spec;
  for (int t = 0; t < 70; ++t) spec.prompt.push_back(static_cast<int32_t>(rng() % 256));
  spec.max_tokens = 6;
  spec.ignore_eos = true;
  const auto mixed = RunMixed({spec});

  auto fabric = std::make_shared<InProcessFabric>();
  Node p = MakeNode(fabric, "p"), d = MakeNode(fabric, "d");
  Connect(d, p, "p");
  // D computed the first 48 tokens for an earlier request: 3 full blocks in its prefix cache.
  RequestSpec warm;
  warm.prompt.assign(spec.prompt.begin(), spec.prompt.begin() + 48);
  warm.max_tokens = 1;
  ASSERT_TRUE(d.engine->AddRequest(100, warm).ok());
  Drain(*d.engine);

  auto prefilled = RunPrefill(p, {spec});
  ASSERT_TRUE(d.engine->AddRequest(0, DecodeSpec(spec, prefilled[0], "p")).ok());
  auto decoded = Drain(*d.engine);
  std::vector<int32_t> joined = {prefilled[0].tokens[0]};
  joined.insert(joined.end(), decoded[0].tokens.begin(), decoded[0].tokens.end());
  EXPECT_EQ(joined, mixed.at(0).tokens);
  // 70 tokens = 5 blocks; 3 were local, so exactly 2 blocks moved.
  EXPECT_EQ(d.connector->Stats().bytes_loaded, 2u * d.engine->kv_block_bytes());
  ExpectAllBlocksFree(*d.engine);
}

TEST(DisaggEngineTest, DeadSourceRecomputesOrFailsPerPolicy) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  RequestSpec spec;
  for (int t = 0; t < 40; ++t) spec.prompt.push_back(static_cast<int32_t>(rng() % 256));
  spec.max_tokens = 5;
  spec.ignore_eos = true;
  const auto mixed = RunMixed({spec});

  auto fabric = std::make_shared<InProcessFabric>();
  Node p = MakeNode(fabric, "p"), d = MakeNode(fabric, "d");
  Connect(d, p, "p");
  auto prefilled = RunPrefill(p, {spec, spec});
  ASSERT_TRUE(fabric->Kill("p"));  // P dies holding the leases

  RequestSpec recompute = DecodeSpec(spec, prefilled[0], "p");
  RequestSpec fail = DecodeSpec(spec, prefilled[1], "p");
  fail.on_kv_failure = KvLoadFailurePolicy::kFail;
  ASSERT_TRUE(d.engine->AddRequest(0, recompute).ok());
  ASSERT_TRUE(d.engine->AddRequest(1, fail).ok());
  auto decoded = Drain(*d.engine);

  std::vector<int32_t> joined = {prefilled[0].tokens[0]};
  joined.insert(joined.end(), decoded[0].tokens.begin(), decoded[0].tokens.end());
  EXPECT_EQ(joined, mixed.at(0).tokens) << "recompute must give the same tokens";
  EXPECT_EQ(decoded[1].reason, FinishReason::kError);
  EXPECT_TRUE(decoded[1].tokens.empty());
  EXPECT_EQ(decoded[1].error.code(), absl::StatusCode::kUnavailable) << decoded[1].error;
  EXPECT_EQ(d.connector->Stats().load_failures, 2u);
  EXPECT_EQ(d.connector->Stats().load_seconds.count, 0u);
  EXPECT_EQ(d.engine->num_kv_recomputes(), 1u) << "only the recompute policy recomputes";
  EXPECT_TRUE(d.engine->TakeQueueTimes().empty()) << "no arrival times were given";
  ExpectAllBlocksFree(*d.engine);
}

TEST(DisaggEngineTest, LeaseExpiryFreesSourceBlocks) {
  auto fabric = std::make_shared<InProcessFabric>();
  Node p = MakeNode(fabric, "p");
  RequestSpec spec;
  for (int t = 0; t < 33; ++t) spec.prompt.push_back(t * 7 % 256);
  spec.max_tokens = 4;
  auto prefilled = RunPrefill(p, {spec}, absl::Milliseconds(30));
  ASSERT_TRUE(prefilled[0].lease.has_value());
  EXPECT_EQ(p.engine->kv_cache_stats().num_free_blocks, p.engine->num_kv_blocks() - 3);
  absl::SleepFor(absl::Milliseconds(60));
  ASSERT_TRUE(p.engine->Step().ok());
  ExpectAllBlocksFree(*p.engine);
  EXPECT_EQ(p.connector->Stats().leases_expired, 1u);
  EXPECT_FALSE(p.connector->ReleaseLease(prefilled[0].lease->lease.lease_id));
}

TEST(DisaggEngineTest, FinishedAtFirstTokenHoldsNothing) {
  auto fabric = std::make_shared<InProcessFabric>();
  Node p = MakeNode(fabric, "p");
  RequestSpec spec;
  spec.prompt = {5, 6, 7};
  spec.max_tokens = 1;
  spec.stop_token_ids.resize(256);  // every token stops: finishes by stop token
  for (int t = 0; t < 256; ++t) spec.stop_token_ids[t] = t;
  spec.hold_kv_for_remote = true;
  ASSERT_TRUE(p.engine->AddRequest(0, spec).ok());
  auto out = Drain(*p.engine);
  EXPECT_EQ(out[0].reason, FinishReason::kStopToken);
  EXPECT_FALSE(out[0].lease.has_value());
  ExpectAllBlocksFree(*p.engine);
}

// Abort and deadline while a READ is in flight: blocks stay allocated until the agent reports
// the transfer ended, then everything is back.
TEST(DisaggEngineTest, AbortAndDeadlineDuringLoadWaitForTheTransferToEnd) {
  RequestSpec spec;
  for (int t = 0; t < 50; ++t) spec.prompt.push_back(t * 3 % 256);
  spec.max_tokens = 5;
  spec.ignore_eos = true;
  const auto mixed = RunMixed({spec});
  auto fabric = std::make_shared<InProcessFabric>();
  Node p = MakeNode(fabric, "p"), d = MakeNode(fabric, "d");
  Connect(d, p, "p");
  auto prefilled = RunPrefill(p, {spec, spec});
  d.agent->HoldTransfers(true);

  RequestSpec aborted = DecodeSpec(spec, prefilled[0], "p");
  RequestSpec late = DecodeSpec(spec, prefilled[1], "p");
  late.remote_kv->deadline = absl::Now() + absl::Milliseconds(50);
  ASSERT_TRUE(d.engine->AddRequest(0, aborted).ok());
  ASSERT_TRUE(d.engine->AddRequest(1, late).ok());
  ASSERT_TRUE(d.engine->Step().ok());  // both start loading
  EXPECT_EQ(d.engine->num_running(), 2);
  EXPECT_TRUE(d.engine->Abort(0));
  ASSERT_TRUE(d.engine->Step().ok());
  EXPECT_LT(d.engine->kv_cache_stats().num_free_blocks, d.engine->num_kv_blocks())
      << "blocks of a cancelled-but-not-ended load must stay allocated";
  absl::SleepFor(absl::Milliseconds(80));
  d.agent->HoldTransfers(false);
  auto decoded = Drain(*d.engine);
  EXPECT_EQ(decoded.count(0), 0u) << "an aborted request reports nothing more";
  // Request 1 hit its deadline, recomputed locally, and still matches.
  std::vector<int32_t> joined = {prefilled[1].tokens[0]};
  joined.insert(joined.end(), decoded[1].tokens.begin(), decoded[1].tokens.end());
  EXPECT_EQ(joined, mixed.at(0).tokens);
  EXPECT_EQ(d.connector->Stats().load_failures, 2u);
  ExpectAllBlocksFree(*d.engine);
}

// The worker daemon lets its transfer agent allocate the pool (shareable memory): the engine must
// use exactly that memory, start from a clean pool whatever it held, and fail cleanly when the
// allocator does.
TEST(DisaggEngineTest, ExternalKvPoolMemoryIsUsedAndCleared) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  RequestSpec spec;
  for (int t = 0; t < 37; ++t) spec.prompt.push_back(static_cast<int32_t>(rng() % 256));
  spec.max_tokens = 6;
  spec.ignore_eos = true;
  const auto expected = RunMixed({spec});
  std::vector<float> memory;
  const ModelConfig model = TinyConfig();
  auto engine = Engine::Create(SmallEngine(), model, RandomModelWeights(model, kWeightSeed),
                               [&memory](int64_t bytes) -> absl::StatusOr<void*> {
                                 memory.assign(bytes / sizeof(float),
                                               std::numeric_limits<float>::quiet_NaN());
                                 return static_cast<void*>(memory.data());
                               });
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->kv_pool_data(), memory.data());
  EXPECT_EQ((*engine)->kv_pool_bytes(), static_cast<int64_t>(memory.size() * sizeof(float)));
  ASSERT_TRUE((*engine)->AddRequest(0, spec).ok());
  auto out = Drain(**engine);
  EXPECT_EQ(out[0].tokens, expected.at(0).tokens);
  auto failing = Engine::Create(
      SmallEngine(), model, RandomModelWeights(model, kWeightSeed),
      [](int64_t) -> absl::StatusOr<void*> { return absl::ResourceExhaustedError("no memory"); });
  EXPECT_EQ(failing.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(DisaggEngineTest, RejectsInconsistentRemoteKv) {
  auto fabric = std::make_shared<InProcessFabric>();
  Node d = MakeNode(fabric, "d");
  RequestSpec spec;
  spec.prompt = {1, 2, 3, 4};
  spec.max_tokens = 4;
  spec.first_token = 9;
  kvtransfer::RemoteKvSpec remote;
  remote.peer = "p";
  remote.num_tokens = 4;
  remote.block_ids = {0, 1};  // 4 tokens need one block
  spec.remote_kv = remote;
  EXPECT_EQ(d.engine->AddRequest(0, spec).code(), absl::StatusCode::kInvalidArgument);
  spec.remote_kv->block_ids = {0};
  spec.remote_kv->num_tokens = 3;
  EXPECT_EQ(d.engine->AddRequest(0, spec).code(), absl::StatusCode::kInvalidArgument);
  spec.remote_kv->num_tokens = 4;
  spec.first_token = -1;
  EXPECT_EQ(d.engine->AddRequest(0, spec).code(), absl::StatusCode::kInvalidArgument);
  spec.first_token = 9;
  EXPECT_TRUE(d.engine->AddRequest(0, spec).ok());
  // Without a connector, disaggregated requests are refused.
  const ModelConfig model = TinyConfig();
  auto plain = Engine::Create(SmallEngine(), model, RandomModelWeights(model, kWeightSeed));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->AddRequest(1, spec).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::runtime
