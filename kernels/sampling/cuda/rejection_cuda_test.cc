// cuda::TokenProbabilities against cpu::TokenProbabilities (the target's p), and
// cuda::RejectionSampleDrafts against cpu::RejectionSampleDrafts (kernels/sampling/rejection.h)
// on the same seeds, so the same uniforms: accepted counts and emitted tokens equal pass for pass,
// on fresh random p / q (peaked, flat, with zeros, q = p: the residual-fallback case, one-hot
// greedy rows), k = 0..6 mixed in one launch, vocab 1 to 128256. Plus seeded reproducibility and
// graph replay with new passes.
//
// Allowed mismatches: the CPU's inverse CDF sums in index order, the kernel in a fixed tree; they
// may pick differently only where u * total lies within ~1e-15 (relative) of a running sum, which
// random draws essentially never hit (the test allows 1 in 10^4 passes and prints any).
#include "kernels/sampling/cuda/rejection_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "absl/types/span.h"
#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/sampling/cuda/sampling_cuda.h"
#include "kernels/sampling/rejection.h"
#include "kernels/sampling/sampling.h"

namespace tandem::kernels::cuda {
namespace {

using cuda_test::DeviceBuffer;

// A batch of verify passes with their probabilities (host side).
struct Batch {
  int64_t vocab = 0;
  std::vector<double> p, q;  // [rows][vocab]
  std::vector<int32_t> drafts;
  std::vector<DeviceRejectionPass> passes;
};

// One random distribution over vocab ids of family `f`: 0 smooth, 1 peaked, 2 with many zeros,
// 3 one-hot (a greedy row).
void RandomRow(int f, int64_t vocab, std::mt19937* rng, double* row) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  double total = 0.0;
  for (int64_t v = 0; v < vocab; ++v) {
    double x = u(*rng);
    if (f == 1) x = std::pow(x, 12.0);
    if (f == 2 && u(*rng) < 0.7) x = 0.0;
    if (f == 3) x = 0.0;
    row[v] = x;
    total += x;
  }
  if (f == 3 || total == 0.0) {
    row[(*rng)() % vocab] = 1.0;
    return;
  }
  for (int64_t v = 0; v < vocab; ++v) row[v] /= total;
}

Batch RandomBatch(int64_t vocab, int64_t num_passes, uint32_t seed) {
  std::mt19937 rng(seed);
  Batch b;
  b.vocab = vocab;
  for (int64_t i = 0; i < num_passes; ++i) {
    DeviceRejectionPass pass;
    pass.num_drafts = static_cast<int32_t>(rng() % 7);
    pass.target_row = static_cast<int64_t>(b.p.size()) / vocab;
    pass.draft_row = static_cast<int64_t>(b.q.size()) / vocab;
    pass.first_draft = static_cast<int64_t>(b.drafts.size());
    pass.seed = rng();
    pass.first_step = rng() % 1000;
    const int family = static_cast<int>(rng() % 4);
    const bool same = rng() % 5 == 0;  // q = p: everything accepted, or the fallback residual
    b.p.resize(b.p.size() + (pass.num_drafts + 1) * vocab);
    b.q.resize(b.q.size() + pass.num_drafts * vocab);
    double* p = b.p.data() + pass.target_row * vocab;
    double* q = b.q.data() + pass.draft_row * vocab;
    for (int32_t j = 0; j <= pass.num_drafts; ++j) RandomRow(family, vocab, &rng, p + j * vocab);
    for (int32_t j = 0; j < pass.num_drafts; ++j) {
      if (same) {
        std::copy(p + j * vocab, p + (j + 1) * vocab, q + j * vocab);
      } else {
        RandomRow(static_cast<int>(rng() % 4), vocab, &rng, q + j * vocab);
      }
      // The draft is drawn from q, as the drafters do (stream 1).
      b.drafts.push_back(cpu::SampleFromWeights(
          q + j * vocab, vocab, SamplingUniform(pass.seed, pass.first_step + j, kDraftStream)));
    }
    b.passes.push_back(pass);
  }
  if (b.q.empty()) b.q.push_back(0.0);
  if (b.drafts.empty()) b.drafts.push_back(0);
  return b;
}

RejectionOutcome Cpu(const Batch& b, const DeviceRejectionPass& pass) {
  const int64_t V = b.vocab, k = pass.num_drafts;
  return cpu::RejectionSampleDrafts(
      absl::MakeConstSpan(b.p).subspan(pass.target_row * V, (k + 1) * V),
      absl::MakeConstSpan(b.q).subspan(pass.draft_row * V, k * V),
      absl::MakeConstSpan(b.drafts).subspan(pass.first_draft, k), V, pass.seed, pass.first_step);
}

std::vector<DeviceRejectionResult> Gpu(const Batch& b) {
  DeviceBuffer<double> p(b.p), q(b.q);
  DeviceBuffer<int32_t> drafts(b.drafts);
  DeviceBuffer<DeviceRejectionPass> passes(b.passes);
  DeviceBuffer<DeviceRejectionResult> out(b.passes.size());
  const absl::Status s =
      RejectionSampleDrafts(p.get(), q.get(), drafts.get(), passes.get(),
                            static_cast<int64_t>(b.passes.size()), b.vocab, out.get(), nullptr);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return out.ToHost();
}

TEST(RejectionCudaTest, EqualsTheCpuReferenceOnTheSameUniforms) {
  TANDEM_SKIP_WITHOUT_GPU();
  const uint32_t seed = cuda_test::TestSeed();
  int64_t passes = 0, mismatches = 0, accepted = 0, drafted = 0;
  for (int64_t vocab : {1, 2, 7, 1000, 32000, 128256}) {
    const int64_t n = vocab > 10000 ? 48 : 600;
    const Batch b = RandomBatch(vocab, n, seed + static_cast<uint32_t>(vocab));
    const std::vector<DeviceRejectionResult> gpu = Gpu(b);
    ASSERT_EQ(gpu.size(), b.passes.size());
    for (size_t i = 0; i < gpu.size(); ++i) {
      const RejectionOutcome cpu = Cpu(b, b.passes[i]);
      ++passes;
      accepted += cpu.accepted;
      drafted += b.passes[i].num_drafts;
      ASSERT_GE(gpu[i].next_token, 0);
      ASSERT_LT(gpu[i].next_token, vocab);
      if (gpu[i].accepted != cpu.accepted || gpu[i].next_token != cpu.next_token) {
        ++mismatches;
        std::printf("vocab %lld pass %zu: GPU (%d, %d) vs CPU (%lld, %d)\n",
                    static_cast<long long>(vocab), i, gpu[i].accepted, gpu[i].next_token,
                    static_cast<long long>(cpu.accepted), cpu.next_token);
      }
    }
  }
  std::printf("%lld passes, %lld drafts, %lld accepted, %lld mismatches\n",
              static_cast<long long>(passes), static_cast<long long>(drafted),
              static_cast<long long>(accepted), static_cast<long long>(mismatches));
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);
  EXPECT_LE(mismatches * 10000, passes);
}

// The same passes give the same results run after run, also replayed from a CUDA graph whose
// passes were rewritten in place (new seeds on the device).
TEST(RejectionCudaTest, SeededAndGraphReplayReproduce) {
  TANDEM_SKIP_WITHOUT_GPU();
  const uint32_t seed = cuda_test::TestSeed();
  Batch b = RandomBatch(4096, 64, seed);
  const std::vector<DeviceRejectionResult> first = Gpu(b);
  const std::vector<DeviceRejectionResult> again = Gpu(b);
  DeviceBuffer<double> p(b.p), q(b.q);
  DeviceBuffer<int32_t> drafts(b.drafts);
  DeviceBuffer<DeviceRejectionPass> passes(b.passes);
  DeviceBuffer<DeviceRejectionResult> out(b.passes.size());
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status s = RejectionSampleDrafts(p.get(), q.get(), drafts.get(), passes.get(), 64,
                                               b.vocab, out.get(), stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (DeviceRejectionPass& pass : b.passes) pass.seed += 17;  // new seeds, same drafts
  ASSERT_EQ(cudaMemcpy(passes.get(), b.passes.data(), b.passes.size() * sizeof(b.passes[0]),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const std::vector<DeviceRejectionResult> replayed = out.ToHost();
  int differs = 0;
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(first[i].accepted, again[i].accepted);
    EXPECT_EQ(first[i].next_token, again[i].next_token);
    const RejectionOutcome cpu = Cpu(b, b.passes[i]);
    EXPECT_EQ(replayed[i].accepted, cpu.accepted) << "pass " << i;
    EXPECT_EQ(replayed[i].next_token, cpu.next_token) << "pass " << i;
    differs += replayed[i].next_token != first[i].next_token;
  }
  EXPECT_GT(differs, 0);  // the new seeds were used
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// The distribution the runner verifies against: cuda::TokenProbabilities equals
// cpu::TokenProbabilities within 1e-12 (absolute, and relative for probabilities above 1e-300)
// on fresh random logits, for greedy, temperature, top-k, top-p and vocab_limit rows in one launch.
TEST(RejectionCudaTest, TokenProbabilitiesEqualTheCpu) {
  TANDEM_SKIP_WITHOUT_GPU();
  const uint32_t seed = cuda_test::TestSeed();
  std::mt19937 rng(seed);
  for (int64_t vocab : {1, 5, 1000, 128256}) {
    std::vector<DeviceSamplingRow> rows;
    for (float t : {0.0f, 0.7f, 1.0f, 2.5f}) {
      for (int32_t top_k : {0, 1, 40}) {
        for (float top_p : {1.0f, 0.9f, 0.3f}) {
          rows.push_back({t, top_k, top_p, 0, 0, rows.size() % 5 == 4 ? vocab / 2 : 0});
        }
      }
    }
    const int64_t n = static_cast<int64_t>(rows.size());
    std::vector<float> logits(n * vocab);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (float& l : logits) l = normal(rng);
    for (int64_t r = 0; r < n; r += 3) logits[r * vocab] = logits[r * vocab + vocab - 1];  // ties
    DeviceBuffer<float> logits_dev(logits);
    DeviceBuffer<DeviceSamplingRow> rows_dev(rows);
    DeviceBuffer<double> probs_dev(n * vocab);
    const int64_t ws = SampleTokensWorkspaceBytes(n, vocab);
    DeviceBuffer<char> workspace(ws);
    const absl::Status s = TokenProbabilities(logits_dev.get(), n, vocab, rows_dev.get(),
                                              probs_dev.get(), workspace.get(), ws, nullptr);
    ASSERT_TRUE(s.ok()) << s;
    const std::vector<double> gpu = probs_dev.ToHost();
    std::vector<double> cpu(vocab);
    double worst = 0.0;
    for (int64_t r = 0; r < n; ++r) {
      SamplingParams p;
      p.temperature = rows[r].temperature;
      p.top_k = rows[r].top_k;
      p.top_p = rows[r].top_p;
      p.vocab_limit = rows[r].vocab_limit;
      cpu::TokenProbabilities(logits.data() + r * vocab, vocab, p, cpu.data());
      for (int64_t v = 0; v < vocab; ++v) {
        const double a = gpu[r * vocab + v], b = cpu[v];
        worst = std::max(worst, std::abs(a - b) / (b > 1e-300 ? b : 1.0));
        ASSERT_LE(std::abs(a - b), 1e-12) << "vocab " << vocab << " row " << r << " id " << v;
        ASSERT_EQ(a == 0.0, b == 0.0) << "vocab " << vocab << " row " << r << " id " << v;
      }
    }
    std::printf("vocab %lld: %lld rows, worst relative difference %.3g\n",
                static_cast<long long>(vocab), static_cast<long long>(n), worst);
    EXPECT_LE(worst, 1e-12);
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda
