// The worker core without gRPC: prefill, decode and mixed Workers in one process, KV over
// InProcessAgents, sources linked by an in-process KvSourceLinks whose lease calls go straight to
// the source's connector. (The gRPC edge over the same core: worker_service_test.)
#include "runtime/worker/worker.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "kvtransfer/handshake.h"
#include "kvtransfer/inprocess/inprocess_agent.h"
#include "kvtransfer/pull_connector.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"
#include "runtime/worker/worker_metrics.h"

namespace tandem::runtime {
namespace {

using kvtransfer::InProcessAgent;
using kvtransfer::InProcessFabric;
using kvtransfer::PullKvConnector;

constexpr uint64_t kLayoutHash = 0x7e57;

// A whole worker core: engine loop, agent, connector, Worker.
struct CoreWorker {
  CoreWorker(std::shared_ptr<InProcessFabric> fabric, const std::string& id,
             tandem::v1::WorkerRole role, kvtransfer::KvSourceLinks* links,
             const std::function<void(WorkerOptions&)>& customize = nullptr,
             const SpeculativeConfig& speculative = {}) {
    ModelConfig model = *PresetConfig("tiny");
    model.max_position_embeddings = 256;
    EngineConfig config;
    config.kv_cache_bytes = int64_t{4} << 20;
    config.num_threads = 1;
    config.speculative = speculative;
    auto engine = Engine::Create(config, model, RandomModelWeights(model, 5));
    EXPECT_TRUE(engine.ok()) << engine.status();
    agent = std::make_unique<InProcessAgent>(fabric, id);
    EXPECT_TRUE(agent
                    ->RegisterMemory((*engine)->kv_pool_data(), (*engine)->kv_pool_bytes(),
                                     tandem::v1::MEMORY_KIND_HOST)
                    .ok());
    kvtransfer::PullKvConnectorOptions options;
    options.block_size = (*engine)->block_size();
    options.block_bytes = static_cast<uint64_t>((*engine)->kv_block_bytes());
    connector = std::make_unique<PullKvConnector>(agent.get(), options);
    (*engine)->AttachConnector(connector.get());
    EngineLoopOptions loop_options;
    loop_options.release_orphan_lease = [c = connector.get()](uint64_t lease) {
      c->ReleaseLease(lease);
    };
    loop = std::make_unique<EngineLoop>(*std::move(engine), loop_options);
    WorkerOptions wo;
    wo.worker_id = id;
    wo.epoch = 1;
    wo.role = role;
    wo.model_id = "tiny-test";
    wo.kv_layout_hash = kLayoutHash;
    wo.address = id + ".local:1";
    if (customize) customize(wo);
    worker = std::make_unique<Worker>(loop.get(), connector.get(), connector.get(), links, wo);
  }
  // Waits (bounded) until every block is free and nothing is leased.
  bool PoolWhole() {
    for (int i = 0; i < 2000; ++i) {
      const tandem::v1::WorkerLoad load = worker->Load();
      if (load.kv_blocks_free() == load.kv_blocks_total() && load.kv_blocks_leased() == 0) {
        return true;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  }

  std::unique_ptr<InProcessAgent> agent;
  std::unique_ptr<PullKvConnector> connector;
  std::unique_ptr<EngineLoop> loop;
  std::unique_ptr<Worker> worker;
};

// KvSourceLinks in one process: links D's agent to a source's agent, and sends lease calls to
// the source's connector directly (counting releases).
class LocalLinks final : public kvtransfer::KvSourceLinks, public kvtransfer::LeaseClient {
 public:
  void AddSource(CoreWorker* source) {
    absl::MutexLock lock(&mu_);
    sources_[source->worker->options().worker_id] = source;
  }
  void set_reader(InProcessAgent* reader) { reader_ = reader; }

  absl::Status EnsurePeer(const tandem::v1::KvHandle& handle) override {
    absl::MutexLock lock(&mu_);
    auto it = sources_.find(handle.worker_id());
    if (it == sources_.end()) return absl::UnavailableError("no such source");
    if (linked_.contains(handle.worker_id())) return absl::OkStatus();
    tandem::v1::TransferHandshake descriptor;
    if (absl::Status s = it->second->agent->FillLocalDescriptor(&descriptor); !s.ok()) return s;
    if (absl::Status s = reader_->AddPeer(handle.worker_id(), descriptor); !s.ok()) return s;
    linked_[handle.worker_id()] = true;
    return absl::OkStatus();
  }
  // As the source's KvTransferService would: the reader is D ("d0"), the handle as presented.
  absl::Status AuthorizeRead(const tandem::v1::KvHandle& handle) override {
    {
      absl::MutexLock lock(&mu_);
      if (!sources_.contains(handle.worker_id())) return absl::UnavailableError("no such source");
    }
    const kvtransfer::LeaseBinding presented = kvtransfer::PresentedBinding(handle);
    return Source(handle.worker_id())
        ->connector->AuthorizeLeaseUse({handle.lease_id(), "d0", &presented});
  }
  std::shared_ptr<kvtransfer::LeaseClient> lease_client() const override { return self_; }
  void RenewLeaseAsync(const std::string& peer, uint64_t, uint64_t lease_id, absl::Duration extend,
                       std::function<void(absl::StatusOr<absl::Time>)> done) override {
    std::optional<absl::Time> deadline = Source(peer)->connector->RenewLease(lease_id, extend);
    if (!deadline.has_value()) return done(absl::NotFoundError("unknown lease"));
    done(*deadline);
  }
  void ReleaseLeaseAsync(const std::string& peer, uint64_t, uint64_t lease_id) override {
    if (!sources_.contains(peer)) return;  // never reachable: nothing to tell (as PeerLinks)
    ++releases_;
    Source(peer)->connector->ReleaseLease(lease_id);
  }
  int releases() const { return releases_; }
  // Shares ownership with nobody: the test owns this object and outlives the workers.
  void SetSelf(std::shared_ptr<LocalLinks> self) { self_ = std::move(self); }

 private:
  CoreWorker* Source(const std::string& peer) {
    absl::MutexLock lock(&mu_);
    return sources_.at(peer);
  }
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, CoreWorker*> sources_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, bool> linked_ ABSL_GUARDED_BY(mu_);
  InProcessAgent* reader_ = nullptr;
  std::shared_ptr<LocalLinks> self_;
  std::atomic<int> releases_{0};
};

RequestSpec RandomSpec(std::mt19937& rng, int len, int max_tokens) {
  RequestSpec spec;
  for (int i = 0; i < len; ++i) spec.prompt.push_back(static_cast<int32_t>(rng() % 256));
  spec.max_tokens = max_tokens;
  spec.ignore_eos = true;
  return spec;
}

const CallerGone kStaying = [] { return false; };

// The value of the one sample of `family` (e.g. "tandem:kv_recomputes_total" or
// "tandem:request_queue_time_seconds_count") in `worker`'s /metrics text; -1 when absent.
double Sample(const Worker& worker, const std::string& family) {
  std::istringstream text(WorkerMetricsText(worker.StatsProto(), worker.LatencySnapshots()));
  for (std::string line; std::getline(text, line);) {
    if (line.rfind(family + "{", 0) != 0) continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

// Collects a stream's tokens and its final update.
struct Collected {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kNone;
  UpdateSink Sink() {
    return [this](const RequestUpdate& u) {
      tokens.insert(tokens.end(), u.new_token_ids.begin(), u.new_token_ids.end());
      finish = u.finish_reason;
      return true;
    };
  }
};

// P, D and a mixed worker; `speculative` is D's (a prefill worker never speculates).
struct Cluster {
  explicit Cluster(const SpeculativeConfig& speculative = {})
      : fabric(std::make_shared<InProcessFabric>()),
        links(std::make_shared<LocalLinks>()),
        p(fabric, "p0", tandem::v1::WORKER_ROLE_PREFILL, nullptr),
        d(fabric, "d0", tandem::v1::WORKER_ROLE_DECODE, links.get(), nullptr, speculative),
        m(fabric, "m0", tandem::v1::WORKER_ROLE_MIXED, nullptr) {
    links->SetSelf(links);
    links->AddSource(&p);
    links->set_reader(d.agent.get());
  }
  ~Cluster() { links->SetSelf(nullptr); }
  std::shared_ptr<InProcessFabric> fabric;
  std::shared_ptr<LocalLinks> links;
  CoreWorker p, d, m;
};

TEST(WorkerTest, PrefillThenDecodeEqualsGenerateWithoutGrpc) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  Cluster c;
  for (int i = 0; i < 5; ++i) {
    const std::string id = "r" + std::to_string(i);
    const RequestSpec spec = RandomSpec(rng, 1 + rng() % 60, 2 + rng() % 8);
    absl::StatusOr<PrefillResult> pre =
        c.p.worker->Prefill(id, spec, /*remote_decode=*/true, absl::ZeroDuration(), kStaying);
    ASSERT_TRUE(pre.ok()) << pre.status();
    ASSERT_TRUE(pre->kv_handle.has_value());
    EXPECT_EQ(pre->first.finish_reason, FinishReason::kNone);
    EXPECT_EQ(pre->kv_handle->worker_id(), "p0");
    EXPECT_EQ(pre->kv_handle->transfer_endpoint(), "p0.local:1");
    EXPECT_EQ(pre->kv_handle->num_tokens(), spec.prompt.size());
    Collected split;
    split.tokens = pre->first.new_token_ids;
    ASSERT_TRUE(c.d.worker
                    ->Decode(id, spec, *pre->kv_handle, pre->first.new_token_ids.at(0),
                             KvLoadFailurePolicy::kFail, kStaying, split.Sink())
                    .ok());
    Collected whole;
    ASSERT_TRUE(c.m.worker->Generate(id, spec, kStaying, whole.Sink()).ok());
    EXPECT_EQ(split.tokens, whole.tokens) << "request " << i;
    EXPECT_EQ(split.finish, FinishReason::kLength);
  }
  // D's connector released every source lease once its load ended: P's pool is whole again.
  EXPECT_EQ(c.links->releases(), 5);
  EXPECT_TRUE(c.p.PoolWhole());
  EXPECT_TRUE(c.d.PoolWhole());
  EXPECT_EQ(c.p.worker->StatsProto().leases_released(), 5u);
  EXPECT_GT(c.d.worker->StatsProto().kv_bytes_received(), 0u);
  // /metrics: every worker queued each of the 5 requests once; D loaded 5 KVs, none failed.
  for (const CoreWorker* w : {&c.p, &c.d, &c.m}) {
    EXPECT_EQ(Sample(*w->worker, "tandem:request_queue_time_seconds_count"), 5)
        << w->worker->options().worker_id;
  }
  EXPECT_EQ(Sample(*c.d.worker, "tandem:kv_transfer_duration_seconds_count"), 5);
  EXPECT_GT(Sample(*c.d.worker, "tandem:kv_transfer_duration_seconds_sum"), 0);
  EXPECT_EQ(Sample(*c.d.worker, "tandem:kv_transfer_bytes_total"),
            c.d.worker->StatsProto().kv_bytes_received());
  EXPECT_GT(Sample(*c.d.worker, "tandem:kv_transfer_bytes_total"), 0);
  EXPECT_EQ(Sample(*c.d.worker, "tandem:kv_transfer_failures_total"), 0);
  EXPECT_EQ(Sample(*c.d.worker, "tandem:kv_recomputes_total"), 0);
  EXPECT_EQ(Sample(*c.p.worker, "tandem:kv_lease_expiries_total"), 0);
  EXPECT_EQ(Sample(*c.p.worker, "tandem:kv_transfer_duration_seconds_count"), 0);
  EXPECT_EQ(Sample(*c.m.worker, "tandem:kv_transfer_duration_seconds_count"), 0);
}

// A P -> D request whose decode worker speculates (n-gram drafts, K = 3) streams exactly the
// tokens of the mixed worker without speculation, accepted runs arriving as they are accepted;
// D's /metrics count the drafts.
TEST(WorkerTest, SpeculativeDecodeAfterPrefillEqualsGenerateAndIsCounted) {
  SpeculativeConfig speculative;
  speculative.method = SpeculativeMethod::kNgram;
  speculative.num_speculative_tokens = 3;
  Cluster c(speculative);
  std::mt19937 rng(7);
  size_t longest_update = 0;
  for (int i = 0; i < 6; ++i) {
    const std::string id = "s" + std::to_string(i);
    RequestSpec spec;
    const int period = 2 + i % 3;  // repetitive prompts: drafts get proposed and accepted
    for (int t = 0; t < 24; ++t) spec.prompt.push_back(3 + static_cast<int32_t>(t % period * 17));
    spec.max_tokens = 24;
    spec.ignore_eos = true;
    absl::StatusOr<PrefillResult> pre =
        c.p.worker->Prefill(id, spec, /*remote_decode=*/true, absl::ZeroDuration(), kStaying);
    ASSERT_TRUE(pre.ok()) << pre.status();
    ASSERT_TRUE(pre->kv_handle.has_value());
    Collected split;
    split.tokens = pre->first.new_token_ids;
    ASSERT_TRUE(c.d.worker
                    ->Decode(id, spec, *pre->kv_handle, pre->first.new_token_ids.at(0),
                             KvLoadFailurePolicy::kFail, kStaying,
                             [&](const RequestUpdate& u) {
                               longest_update = std::max(longest_update, u.new_token_ids.size());
                               return split.Sink()(u);
                             })
                    .ok());
    Collected whole;
    ASSERT_TRUE(c.m.worker->Generate(id, spec, kStaying, whole.Sink()).ok());
    EXPECT_EQ(split.tokens, whole.tokens) << "request " << i;
    EXPECT_EQ(split.tokens.size(), 24u);
  }
  EXPECT_GT(longest_update, 1u) << "no accepted run reached the stream";
  EXPECT_TRUE(c.d.PoolWhole());
  const tandem::v1::WorkerStats d = c.d.worker->StatsProto();
  EXPECT_GT(d.spec_verify_passes(), 0u);
  EXPECT_GT(d.spec_accepted_tokens(), 0u);
  EXPECT_GE(d.spec_draft_tokens(), d.spec_accepted_tokens());
  EXPECT_EQ(Sample(*c.d.worker, "tandem:spec_decode_num_accepted_tokens_total"),
            d.spec_accepted_tokens());
  EXPECT_EQ(Sample(*c.d.worker, "tandem:spec_decode_num_draft_tokens_total"),
            d.spec_draft_tokens());
  EXPECT_DOUBLE_EQ(Sample(*c.d.worker, "tandem:spec_decode_acceptance_rate"),
                   static_cast<double>(d.spec_accepted_tokens()) / d.spec_draft_tokens());
  EXPECT_GT(Sample(*c.d.worker, "tandem:spec_decode_mean_accepted_length"), 1.0);
  // Neither the prefill worker nor the mixed one (no speculation configured) drafted.
  EXPECT_EQ(Sample(*c.p.worker, "tandem:spec_decode_num_draft_tokens_total"), 0);
  EXPECT_EQ(Sample(*c.m.worker, "tandem:spec_decode_num_draft_tokens_total"), 0);
}

TEST(WorkerTest, AbortAfterPrefillReleasesTheLeaseAtOnce) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  Cluster c;
  absl::StatusOr<PrefillResult> pre = c.p.worker->Prefill(
      "held", RandomSpec(rng, 40, 8), /*remote_decode=*/true, absl::Seconds(30), kStaying);
  ASSERT_TRUE(pre.ok()) << pre.status();
  EXPECT_GT(c.p.worker->Load().kv_blocks_leased(), 0u);
  EXPECT_TRUE(c.p.worker->Abort("held"));
  EXPECT_FALSE(c.p.worker->Abort("held"));
  EXPECT_TRUE(c.p.PoolWhole()) << "blocks must come back well before the 30 s lease";
  EXPECT_EQ(c.p.worker->StatsProto().leases_released(), 1u);
}

// The caller (the router) gives up on a prefill in the moment it ends: its KV lease is granted
// but nobody will ever read it. It is released at once, whether the handler sees the caller gone
// before it took the final update (the engine no longer knows the request, so an abort frees
// nothing) or after it built the handle. Before: held until the lease expired (the H5 fault
// probe: a prefill worker stopped 10 s under 8 streams, 2 leases expired 30 s later).
TEST(WorkerTest, ACallerGoneAsThePrefillEndsReleasesItsLeaseAtOnce) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  Cluster c;
  for (int i = 0; i < 6; ++i) {
    // Gone from the moment the engine granted the lease (the step that ended the prompt ran):
    // the handler then sees the caller gone before or after it took the final update.
    const CallerGone gone = [&] { return c.p.worker->Load().kv_blocks_leased() > 0; };
    absl::StatusOr<PrefillResult> pre =
        c.p.worker->Prefill(absl::StrCat("leaving-", i), RandomSpec(rng, 40 + 7 * i, 8),
                            /*remote_decode=*/true, absl::Seconds(30), gone);
    EXPECT_EQ(pre.status().code(), absl::StatusCode::kCancelled) << pre.status();
    EXPECT_EQ(c.p.worker->Load().kv_blocks_leased(), 0u) << "request " << i;
    EXPECT_TRUE(c.p.PoolWhole()) << "blocks must come back well before the 30 s lease";
  }
  EXPECT_EQ(c.p.worker->StatsProto().leases_expired(), 0u);
}

TEST(WorkerTest, TheWorkerBoundsLeasesAndTheirIdsAreUnguessable) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  Cluster c;
  // A caller asking for 49 days gets the worker's cap (2 minutes by default).
  absl::StatusOr<PrefillResult> greedy = c.p.worker->Prefill(
      "greedy", RandomSpec(rng, 20, 4), /*remote_decode=*/true, absl::Hours(24 * 49), kStaying);
  ASSERT_TRUE(greedy.ok()) << greedy.status();
  const absl::Time deadline = absl::FromUnixMillis(greedy->kv_handle->lease_deadline_unix_ms());
  EXPECT_LE(deadline, absl::Now() + c.p.worker->options().max_lease);
  absl::StatusOr<PrefillResult> other = c.p.worker->Prefill(
      "other", RandomSpec(rng, 20, 4), /*remote_decode=*/true, absl::ZeroDuration(), kStaying);
  ASSERT_TRUE(other.ok()) << other.status();
  // Not sequential: knowing one lease id tells nothing about the next.
  const uint64_t a = greedy->kv_handle->lease_id(), b = other->kv_handle->lease_id();
  EXPECT_NE(a, 0u);
  EXPECT_NE(b, 0u);
  EXPECT_GT(a > b ? a - b : b - a, 1u << 20);
  EXPECT_TRUE(c.p.worker->Abort("greedy"));
  EXPECT_TRUE(c.p.worker->Abort("other"));
  EXPECT_TRUE(c.p.PoolWhole());
}

// The lease is bound to the decode worker the router named: that worker reads, another is
// refused (PERMISSION_DENIED, no recompute), and so is a handle of another request; a
// reassignment moves it. With require_decode_worker a Prefill must name one.
TEST(WorkerTest, LeasesServeOnlyTheDecodeWorkerTheyAreBoundTo) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  Cluster c;
  const RequestSpec spec = RandomSpec(rng, 30, 4);
  absl::StatusOr<PrefillResult> for_d0 =
      c.p.worker->Prefill("a", spec, true, absl::ZeroDuration(), kStaying, "d0");
  ASSERT_TRUE(for_d0.ok()) << for_d0.status();
  EXPECT_EQ(for_d0->kv_handle->request_id(), "a");
  Collected ok;
  const absl::Status served = c.d.worker->Decode("a", spec, *for_d0->kv_handle, 1,
                                                 KvLoadFailurePolicy::kFail, kStaying, ok.Sink());
  EXPECT_TRUE(served.ok()) << served;

  absl::StatusOr<PrefillResult> for_d9 =
      c.p.worker->Prefill("b", spec, true, absl::ZeroDuration(), kStaying, "d9");
  ASSERT_TRUE(for_d9.ok()) << for_d9.status();
  Collected refused;
  const absl::Status not_ours = c.d.worker->Decode(
      "b", spec, *for_d9->kv_handle, 1, KvLoadFailurePolicy::kRecompute, kStaying, refused.Sink());
  EXPECT_EQ(not_ours.code(), absl::StatusCode::kPermissionDenied) << not_ours;
  EXPECT_TRUE(refused.tokens.empty()) << "a refused handle must not be recomputed either";
  // Another request's handle under this request's id: refused on D before anything moves.
  const absl::Status other_request = c.d.worker->Decode(
      "c", spec, *for_d9->kv_handle, 1, KvLoadFailurePolicy::kFail, kStaying, refused.Sink());
  EXPECT_EQ(other_request.code(), absl::StatusCode::kInvalidArgument) << other_request;
  // The router moves it to d0: now it reads.
  EXPECT_EQ(c.p.worker->ReassignLease("c", for_d9->kv_handle->lease_id(), "d0").code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(c.p.worker->ReassignLease("b", for_d9->kv_handle->lease_id(), "d0").ok());
  Collected moved;
  const absl::Status after = c.d.worker->Decode("b", spec, *for_d9->kv_handle, 1,
                                                KvLoadFailurePolicy::kFail, kStaying, moved.Sink());
  EXPECT_TRUE(after.ok()) << after;
  EXPECT_EQ(moved.tokens, ok.tokens);
  EXPECT_TRUE(c.p.PoolWhole());
  EXPECT_TRUE(c.d.PoolWhole());

  CoreWorker strict(c.fabric, "p1", tandem::v1::WORKER_ROLE_PREFILL, nullptr,
                    [](WorkerOptions& o) { o.require_decode_worker = true; });
  EXPECT_EQ(strict.worker->Prefill("x", spec, true, absl::ZeroDuration(), kStaying).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(strict.PoolWhole());
}

TEST(WorkerTest, CallerGoneMidStreamAbortsAndFreesBlocks) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  Cluster c;
  int seen = 0;
  std::atomic<bool> gone{false};
  const absl::Status s = c.m.worker->Generate(
      "leaving", RandomSpec(rng, 30, 200), [&] { return gone.load(); },
      [&](const RequestUpdate& u) {
        seen += static_cast<int>(u.new_token_ids.size());
        if (seen >= 3) gone = true;
        return true;
      });
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_LT(seen, 200);
  EXPECT_TRUE(c.m.PoolWhole());
  EXPECT_EQ(c.m.worker->NumInFlight(), 0);
}

TEST(WorkerTest, RolesDrainingAndBadHandlesAreRefusedBeforeAnythingIsAllocated) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  Cluster c;
  EXPECT_EQ(c.d.worker->Admit(tandem::v1::WORKER_ROLE_PREFILL, "Prefill").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(c.m.worker->Admit(tandem::v1::WORKER_ROLE_PREFILL, "Prefill").ok());
  // A handle of another layout, or with no source: INVALID_ARGUMENT, nothing leased or loaded.
  tandem::v1::KvHandle handle;
  handle.set_worker_id("p0");
  handle.set_layout_hash(kLayoutHash + 1);
  Collected out;
  EXPECT_EQ(c.d.worker
                ->Decode("x", RandomSpec(rng, 8, 4), handle, 1, KvLoadFailurePolicy::kFail,
                         kStaying, out.Sink())
                .code(),
            absl::StatusCode::kInvalidArgument);
  handle.set_layout_hash(kLayoutHash);
  handle.clear_worker_id();
  EXPECT_EQ(c.d.worker
                ->Decode("x", RandomSpec(rng, 8, 4), handle, 1, KvLoadFailurePolicy::kFail,
                         kStaying, out.Sink())
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(out.tokens.empty());
  EXPECT_TRUE(c.d.PoolWhole());
  // Too long for the model: refused before P holds anything.
  EXPECT_EQ(
      c.p.worker->Prefill("long", RandomSpec(rng, 200, 100), true, absl::ZeroDuration(), kStaying)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  c.p.worker->StartDraining();
  EXPECT_EQ(c.p.worker->Admit(tandem::v1::WORKER_ROLE_PREFILL, "Prefill").code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(c.p.worker->status(), tandem::v1::SERVING_STATUS_DRAINING);
  EXPECT_TRUE(c.p.PoolWhole());
}

TEST(WorkerTest, UnreachableKvSourcesMakeADecodeWorkerNotServingUntilItsProbe) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  auto fabric = std::make_shared<InProcessFabric>();
  auto links = std::make_shared<LocalLinks>();  // knows no source: every link fails
  links->SetSelf(links);
  CoreWorker d(fabric, "d0", tandem::v1::WORKER_ROLE_DECODE, links.get(), [](WorkerOptions& o) {
    o.kv_failures_unhealthy = 3;
    o.kv_unhealthy_probe = absl::Milliseconds(300);
  });
  links->set_reader(d.agent.get());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(d.worker->status(), tandem::v1::SERVING_STATUS_SERVING) << i;
    const RequestSpec spec = RandomSpec(rng, 20, 3);
    tandem::v1::KvHandle handle;
    handle.set_worker_id("p-unreachable");
    handle.set_request_id("r" + std::to_string(i));
    handle.set_layout_hash(kLayoutHash);
    handle.set_num_tokens(spec.prompt.size());
    handle.add_block_ids(0);
    handle.add_block_ids(1);
    Collected out;
    // Recompute hides nothing: the request succeeds, the failure is counted.
    ASSERT_TRUE(d.worker
                    ->Decode("r" + std::to_string(i), spec, handle, 5,
                             KvLoadFailurePolicy::kRecompute, kStaying, out.Sink())
                    .ok());
    EXPECT_EQ(out.tokens.size(), 2u);
  }
  EXPECT_EQ(d.worker->StatsProto().kv_load_failures(), 3u);
  EXPECT_EQ(Sample(*d.worker, "tandem:kv_transfer_failures_total"), 3);
  EXPECT_EQ(Sample(*d.worker, "tandem:kv_recomputes_total"), 3);
  EXPECT_EQ(Sample(*d.worker, "tandem:kv_transfer_duration_seconds_count"), 0);
  EXPECT_EQ(Sample(*d.worker, "tandem:request_queue_time_seconds_count"), 3);
  EXPECT_EQ(d.worker->status(), tandem::v1::SERVING_STATUS_NOT_SERVING);
  absl::SleepFor(absl::Milliseconds(400));
  EXPECT_EQ(d.worker->status(), tandem::v1::SERVING_STATUS_SERVING) << "probes again";
  links->SetSelf(nullptr);
}

}  // namespace
}  // namespace tandem::runtime
