// Cancel at every phase of a request, randomized (tests/reliability/README.md): 100 iterations,
// 1000 with TANDEM_LONG=1. Each iteration picks a phase and a way to end the request:
//
//   phase     how it is reached                                       confirmed when
//   queued    P runs one request at a time (--max_num_seqs=1); a 1500- P reported one running, one
//             token prompt prefills while the victim waits behind it   waiting; no token yet
//   prefill   a 600-1500-token prompt (chunks of 256 tokens), ended     no token yet
//             0-40 ms after P reports it running
//   transfer  ended right after the first token (from P) arrived: D is  exactly one token
//             admitting it, loading its KV from P or running step one
//   decode    ended after 2-100 streamed tokens                         two tokens or more
//   deadline  a client deadline of 1-300 ms, whatever phase it falls in  (classified by tokens)
//
// and ends it by client cancel, Router.Abort or (deadline) the client's deadline. Then, within
// one second of the end (95% of the iterations; every one within 5 s: kReleaseTarget), both
// workers' KV pools must be whole: no block held, none leased (the P lease of a cancelled
// request is released at once, not when it expires), nothing running or waiting. At the end no
// lease was left to expire and no thread or fd leaked.
#include <algorithm>
#include <array>
#include <random>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/reliability/reliability_util.h"

namespace tandem::reliability {
namespace {

enum Phase { kQueued, kPrefill, kTransfer, kDecode, kDeadline, kNumPhases };
constexpr std::array<const char*, kNumPhases> kPhaseNames = {"queued", "prefill", "transfer",
                                                             "decode", "deadline"};
enum How { kClientCancel, kRouterAbort, kNumHows };

// "Back to baseline within a second" (issue 21: a cancelled request's P lease is released at
// once, not at its expiry, 30 s by default). A release waits for the step or KV read in flight
// to end, and on a loaded 2-core machine those straggle: up to 886 ms in 10 runs here at load
// average 4-6 (prefill and transfer phases; the median is tens of ms). So 95% of the
// iterations must be whole within kReleaseTarget, and every one within kReleaseCap: far below
// the lease, above UCX's forced close of a stuck cancelled read (1 s).
constexpr absl::Duration kReleaseTarget = absl::Seconds(1);
constexpr absl::Duration kReleaseCap = absl::Seconds(5);

// Polls the worker's load until `pred` holds (true) or `timeout` passes (false).
template <typename Pred>
bool WaitLoad(Cluster& cluster, const std::string& worker, Pred pred, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    absl::StatusOr<v1::WorkerStats> s = cluster.Stats(worker);
    if (s.ok() && pred(s->load())) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return false;
}

void AbortAtRouter(Cluster& cluster, const std::string& id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  v1::AbortRequest req;
  req.set_request_id(id);
  v1::AbortResponse resp;
  const grpc::Status s = cluster.router().Abort(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

struct Counts {
  std::array<int, kNumPhases> tried{};
  std::array<int, kNumPhases> confirmed{};
  int finished_first = 0;
  absl::Duration worst_release;
  std::array<absl::Duration, kNumPhases> worst_release_in{};
  int over_target = 0;  // releases slower than kReleaseTarget
};

TEST(CancelTest, CancelAtEveryPhaseReleasesPAndDWithinASecond) {
  const int iterations = Iterations(100, 1000);
  e2e::ClusterOptions options = SmallModelCluster(1, 1, 0);
  // One request at a time on P, prompts in chunks of 256 tokens: a prompt is visibly running
  // (the worker's load is published after every step) for several steps, and a second one
  // visibly waits behind it.
  options.prefill_flags = {"--max_num_seqs=1", "--max_num_batched_tokens=256"};
  auto cluster = Start(options);
  ASSERT_NE(cluster, nullptr);
  WarmUp(*cluster, 8, 1);
  const LeakCheck leaks(*cluster);
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  Counts counts;
  for (int it = 0; it < iterations; ++it) {
    const Phase phase = static_cast<Phase>(rng() % kNumPhases);
    const How how = static_cast<How>(rng() % kNumHows);
    SCOPED_TRACE(testing::Message() << "iteration " << it << ": " << kPhaseNames[phase] << ", "
                                    << (how == kClientCancel ? "client cancel" : "Router.Abort"));
    ++counts.tried[phase];
    const std::string id = absl::StrCat("cancel-", seed, "-", it);
    const uint32_t prompt_seed = seed + 7919u * it;
    // A different prompt every iteration: no prefix-cache hit shortens a phase.
    v1::GenerateRequest victim;
    absl::Duration deadline = absl::Seconds(30);
    std::thread hog;
    switch (phase) {
      case kQueued:
        hog = std::thread([&cluster, prompt_seed] {
          Outcome o = RunRequest(cluster->router(), MakeRequest(prompt_seed ^ 0x5a5a, 1500, 2));
          EXPECT_TRUE(o.status.ok()) << "hog: " << o.status.error_message();
        });
        EXPECT_TRUE(WaitLoad(
            *cluster, "prefill-0", [](const v1::WorkerLoad& l) { return l.num_running() > 0; },
            absl::Seconds(2)));
        victim = MakeRequest(prompt_seed, 100, 300);
        break;
      case kPrefill:
        victim = MakeRequest(prompt_seed, 600 + static_cast<int>(rng() % 900), 300);
        break;
      case kTransfer:
        victim = MakeRequest(prompt_seed, 800 + static_cast<int>(rng() % 700), 300);
        break;
      case kDecode:
        victim = MakeRequest(prompt_seed, 50 + static_cast<int>(rng() % 200), 1000);
        break;
      case kDeadline:
        victim = MakeRequest(prompt_seed, 50 + static_cast<int>(rng() % 1200), 300);
        deadline = absl::Milliseconds(1 + rng() % 300);
        break;
      default:
        break;
    }
    victim.set_request_id(id);
    Stream s(cluster->router(), victim, deadline);
    bool confirmed = false;
    switch (phase) {
      case kQueued:
        confirmed = WaitLoad(
            *cluster, "prefill-0",
            [](const v1::WorkerLoad& l) { return l.num_running() > 0 && l.num_waiting() > 0; },
            absl::Seconds(2));
        break;
      case kPrefill:
        confirmed = WaitLoad(
            *cluster, "prefill-0", [](const v1::WorkerLoad& l) { return l.num_running() > 0; },
            absl::Seconds(2));
        absl::SleepFor(absl::Milliseconds(rng() % 40));
        break;
      case kTransfer:
        s.ReadTokens(1);
        break;
      case kDecode:
        s.ReadTokens(2 + static_cast<int>(rng() % 99));
        break;
      default:
        break;
    }
    absl::Time ended = absl::Now();
    if (phase != kDeadline) {
      if (how == kClientCancel) {
        s.Cancel();
      } else {
        AbortAtRouter(*cluster, id);
      }
      ended = absl::Now();
    }
    const int tokens_at_end = s.tokens();
    const Outcome o = s.Finish();
    if (phase == kDeadline) ended = std::min(absl::Now(), absl::Now() - o.took + deadline);
    switch (phase) {
      case kQueued:
      case kPrefill:
        confirmed = confirmed && tokens_at_end == 0;
        break;
      case kTransfer:
        confirmed = tokens_at_end == 1;
        break;
      case kDecode:
        confirmed = tokens_at_end >= 2;
        break;
      case kDeadline:
        confirmed = o.status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
        break;
      default:
        break;
    }
    counts.confirmed[phase] += confirmed ? 1 : 0;
    // How the request ended, as the client saw it.
    if (o.status.ok() && o.finish != v1::FINISH_REASON_ABORTED) {
      ++counts.finished_first;  // it completed before the cancel landed
      EXPECT_EQ(o.tokens.size(), victim.sampling().max_tokens());
    } else if (phase == kDeadline) {
      EXPECT_EQ(o.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
          << o.status.error_message();
    } else if (how == kClientCancel) {
      EXPECT_EQ(o.status.error_code(), grpc::StatusCode::CANCELLED) << o.status.error_message();
    } else {
      EXPECT_TRUE(o.status.ok()) << o.status.error_message();
      EXPECT_EQ(o.finish, v1::FINISH_REASON_ABORTED);
    }
    if (hog.joinable()) {
      hog.join();
      ended = std::max(ended, absl::Now());
    }
    absl::StatusOr<absl::Duration> whole = WaitPoolsWhole(*cluster, absl::Seconds(10));
    ASSERT_TRUE(whole.ok()) << whole.status() << "\n" << cluster->Logs();
    const absl::Duration release = absl::Now() - ended;
    counts.worst_release = std::max(counts.worst_release, release);
    counts.worst_release_in[phase] = std::max(counts.worst_release_in[phase], release);
    counts.over_target += release > kReleaseTarget ? 1 : 0;
    EXPECT_LE(release, kReleaseCap)
        << "P and D were back to baseline only " << release << " after the request ended";
  }
  std::printf(
      "%d iterations, %d completed before the cancel landed; worst release %s, %d over %s\n",
      iterations, counts.finished_first, absl::FormatDuration(counts.worst_release).c_str(),
      counts.over_target, absl::FormatDuration(kReleaseTarget).c_str());
  EXPECT_LE(counts.over_target * 20, iterations)
      << counts.over_target << " of " << iterations << " releases took over " << kReleaseTarget;
  for (int p = 0; p < kNumPhases; ++p) {
    std::printf("  %-9s tried %3d, hit the phase %3d, worst release %s\n", kPhaseNames[p],
                counts.tried[p], counts.confirmed[p],
                absl::FormatDuration(counts.worst_release_in[p]).c_str());
    // Most tries land in their phase (transfer is the narrowest: milliseconds).
    if (counts.tried[p] >= 10) {
      EXPECT_GE(counts.confirmed[p] * 4, counts.tried[p]) << kPhaseNames[p] << " rarely hit";
    }
  }
  for (const char* w : {"prefill-0", "decode-0"}) {
    absl::StatusOr<v1::WorkerStats> s = cluster->Stats(w);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->leases_expired(), 0u) << w << ": a lease was left to expire";
  }
  ExpectNothingLost(*cluster, leaks);
}

}  // namespace
}  // namespace tandem::reliability
