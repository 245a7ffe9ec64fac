// kRows16's PDL prologue (MlaPlanInput::prewait) and the TMA kernels' phase stamps
// (MlaPlanInput::phase_stamps) change no result: MlaLatentAttention with either on equals the
// same call with both off bit for bit (o_lat and LSE), and all of them match the CPU reference
// cpu::MlaPagedAttention. Every call runs right behind a kernel that writes the newest q_len
// latents of every request (MlaWriteLatent, the step's own latents; the pool's older latents are
// restored by a copy before it, the newest slots NaN until it writes them), eagerly and in a
// CUDA graph, so a prologue that read one of the newest latents before griddepcontrol.wait would
// see NaN. The CPU reference runs the absorbed path with W_UK = W_UV = identity (Dn = Dv = L), so
// its output is o_lat. Random inputs; q_len 1 and 2; contexts ending mid-tile and on a tile
// boundary; splits 1, 2 and planned. Skips without a GPU; off sm_90 the plan runs the mma.sync
// kernel (prewait and stamps unused, the comparisons still hold).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <random>
#include <sstream>
#include <utility>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/attention/attention_test_util.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/mla/mla_attention.h"
#include "kernels/mla/mla_cuda.h"
#include "kernels/mla/mla_phase_stamps.h"
#include "kernels/mla/mla_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using cuda_test::DeviceBuffer;
using T = __nv_bfloat16;

// 16 heads, latent 512 + 64; nope = v = 512 so that identity W_UK / W_UV make the CPU's output
// o_lat.
constexpr MlaDims kDims{.num_heads = 16,
                        .qk_nope_head_dim = 512,
                        .qk_rope_head_dim = 64,
                        .kv_lora_rank = 512,
                        .v_head_dim = 512};

struct Result {
  std::vector<T> o;
  std::vector<float> lse;
};

bool SameBits(const Result& a, const Result& b) {
  return a.o.size() == b.o.size() && a.lse.size() == b.lse.size() &&
         std::memcmp(a.o.data(), b.o.data(), a.o.size() * sizeof(T)) == 0 &&
         std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)) == 0;
}

void RunCase(MlaTmaSchedule schedule, int q_len, const std::vector<int32_t>& lens, int splits,
             std::mt19937& rng) {
  const int64_t S = static_cast<int64_t>(lens.size()), H = kDims.num_heads, bs = 64;
  const int64_t D = kDims.LatentDim(), L = kDims.kv_lora_rank;
  const mla_test::ShuffledPages pages = mla_test::ShufflePages(lens, bs, rng);
  const KvCacheLayout layout = pages.Layout(bs, D);
  const int64_t n_lat = static_cast<int64_t>(pages.slots.size()), Tn = S * q_len;
  std::vector<int32_t> qsl(S + 1);
  for (int64_t s = 0; s <= S; ++s) qsl[s] = static_cast<int32_t>(s * q_len);
  std::vector<float> latent = attention_test::RandomNormal(rng, n_lat * D, 1.0f);
  std::vector<float> q = attention_test::RandomNormal(rng, Tn * H * D, 1.0f);
  cuda_test::RoundTo<T>(latent);
  cuda_test::RoundTo<T>(q);
  // The full pool (the reference's) and the old one (the newest q_len latents of every request
  // NaN); the newest latents and their slots for the writing kernel.
  std::vector<float> pool(layout.TotalElems(), std::nanf("")), old_pool = pool, fresh;
  std::vector<int64_t> fresh_slots;
  ASSERT_TRUE(
      cpu::WriteLatentCache(latent.data(), pages.slots.data(), n_lat, 1, {pool.data(), layout})
          .ok());
  int64_t j = 0;
  for (int64_t s = 0; s < S; ++s) {
    for (int32_t k = 0; k < lens[s]; ++k, ++j) {
      const bool newest = k >= lens[s] - q_len;
      if (newest) {
        fresh.insert(fresh.end(), latent.begin() + j * D, latent.begin() + (j + 1) * D);
        fresh_slots.push_back(pages.slots[j]);
      } else {
        ASSERT_TRUE(cpu::WriteLatentCache(latent.data() + j * D, &pages.slots[j], 1, 1,
                                          {old_pool.data(), layout})
                        .ok());
      }
    }
  }
  // W_UK = W_UV = identity: kv_b_proj rows h * 1024 + i (W_UK) and h * 1024 + 512 + i (W_UV).
  std::vector<float> kv_b(H * 2 * L * L, 0.0f);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t i = 0; i < L; ++i) {
      kv_b[(h * 2 * L + i) * L + i] = 1.0f;
      kv_b[(h * 2 * L + L + i) * L + i] = 1.0f;
    }
  }
  AttentionBatch hb{qsl.data(), lens.data(), pages.tables.data(), S, pages.max_blocks};
  const float scale = 1.0f / std::sqrt(576.0f);
  std::vector<float> want(Tn * H * L), want_lse(Tn * H);
  ASSERT_TRUE(cpu::MlaPagedAttention(q.data(), kv_b.data(), kDims, {pool.data(), layout}, 1, hb,
                                     scale, MlaMode::kAbsorbed, want.data(), want_lse.data(),
                                     nullptr)
                  .ok());

  DeviceBuffer<T> pool_d(layout.TotalElems()), old_d(cuda_test::Convert<T>(old_pool)),
      fresh_d(cuda_test::Convert<T>(fresh)), q_d(cuda_test::Convert<T>(q)), o_d(Tn * H * L);
  DeviceBuffer<int64_t> slots_d(fresh_slots);
  DeviceBuffer<int32_t> qsl_d(qsl), lens_d(lens), tables_d(pages.tables);
  DeviceBuffer<float> lse_d(Tn * H);
  const DeviceKvCache cache{pool_d.get(), layout, KvDtype::kBf16};
  const AttentionBatch db{qsl_d.get(), lens_d.get(), tables_d.get(), S, pages.max_blocks};
  MlaPlanInput in{.dims = kDims,
                  .num_seqs = S,
                  .num_tokens = Tn,
                  .max_q_len = q_len,
                  .max_seq_len = pages.max_len,
                  .num_splits = splits,
                  .tma_schedule = schedule,
                  .workspace_zeroed = true};
  absl::StatusOr<MlaPlan> plan = PlanMla(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  DeviceBuffer<unsigned char> ws(plan->workspace_bytes);
  TANDEM_CUDA_CHECK(cudaMemset(ws.get(), 0xff, plan->workspace_bytes));
  TANDEM_CUDA_CHECK(cudaMemset(ws.get(), 0, kMlaMergeCounterBytes));
  const int64_t ctas = int64_t{plan->num_splits} * plan->row_tiles * S;
  DeviceBuffer<unsigned long long> stamps_d(ctas * kMlaStampWords);
  cudaStream_t stream = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamCreate(&stream));
  // The old pool, the writing kernel, the attention (PDL-launched behind it with prewait).
  auto call = [&](bool prewait, bool stamps) -> absl::Status {
    MlaPlan p = *plan;
    p.input.prewait = prewait;
    p.input.phase_stamps = stamps ? stamps_d.get() : nullptr;
    if (cudaMemcpyAsync(pool_d.get(), old_d.get(), layout.TotalElems() * sizeof(T),
                        cudaMemcpyDeviceToDevice, stream) != cudaSuccess) {
      return absl::InternalError("cudaMemcpyAsync");
    }
    absl::Status st =
        MlaWriteLatent<T>(fresh_d.get(), D, fresh_d.get() + L, D, slots_d.get(),
                          static_cast<int64_t>(fresh_slots.size()), kDims, cache, 1, stream);
    if (st.ok()) {
      st = MlaLatentAttention<T>(q_d.get(), cache, 1, db, scale, p, ws.get(), o_d.get(),
                                 lse_d.get(), stream);
    }
    return st;
  };
  auto fetch = [&]() -> Result {
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    Result r{o_d.ToHost(), lse_d.ToHost()};
    EXPECT_EQ(cudaMemset(o_d.get(), 0xff, Tn * H * L * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemset(lse_d.get(), 0xff, Tn * H * sizeof(float)), cudaSuccess);
    return r;
  };
  const char* name = schedule == MlaTmaSchedule::kRows16 ? "kRows16" : "kSerial";
  std::ostringstream what;
  what << name << " q_len " << q_len << " lens " << lens[0] << ".. splits " << plan->num_splits
       << " (asked " << splits << ")";
  ASSERT_TRUE(call(false, false).ok());
  const Result base = fetch();
  // Against the CPU.
  float max_ref = 0.0f, max_err = 0.0f, max_lse_err = 0.0f;
  for (size_t i = 0; i < want.size(); ++i) {
    max_ref = std::max(max_ref, std::abs(want[i]));
    max_err = std::max(max_err, std::abs(__bfloat162float(base.o[i]) - want[i]));
  }
  for (size_t i = 0; i < want_lse.size(); ++i) {
    max_lse_err = std::max(max_lse_err, std::abs(base.lse[i] - want_lse[i]));
  }
  EXPECT_GT(max_ref, 0.0f);
  EXPECT_LE(max_err, 2.5e-2f * max_ref) << what.str();
  EXPECT_LE(max_lse_err, 2e-2f) << what.str();
  std::cout << what.str() << ": max|err| " << max_err << " of " << max_ref << ", lse "
            << max_lse_err << "\n";
  // Stamps on, prewait on, both: the same bits.
  const std::vector<std::pair<bool, bool>> variants = {{false, true}, {true, false}, {true, true}};
  for (const auto& [prewait, stamps] : variants) {
    TANDEM_CUDA_CHECK(cudaMemset(stamps_d.get(), 0, ctas * kMlaStampWords * 8));
    ASSERT_TRUE(call(prewait, stamps).ok());
    EXPECT_TRUE(SameBits(fetch(), base))
        << what.str() << ": prewait " << prewait << " stamps " << stamps << " differ";
    if (stamps) {  // every filled CTA stamped its entry
      const std::vector<unsigned long long> h = stamps_d.ToHost();
      int64_t entered = 0;
      for (int64_t c = 0; c < ctas; ++c) entered += h[c * kMlaStampWords] != 0;
      std::cout << "  stamps: " << entered << " of " << ctas << " CTAs entered\n";
    }
  }
  // A CUDA graph of two prewait calls (the second PDL-launched behind the first's write kernel),
  // replayed twice.
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  absl::Status cst = call(true, false);
  if (cst.ok()) cst = call(true, false);
  cudaGraph_t graph = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(cst.ok()) << cst;
  cudaGraphExec_t exec = nullptr;
  TANDEM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int r = 0; r < 2; ++r) {
    TANDEM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    EXPECT_TRUE(SameBits(fetch(), base)) << what.str() << ": graph replay " << r << " differs";
  }
  std::vector<uint32_t> counters(kMlaMergeCounterBytes / 4, 1);
  TANDEM_CUDA_CHECK(
      cudaMemcpy(counters.data(), ws.get(), kMlaMergeCounterBytes, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::count(counters.begin(), counters.end(), 0u),
            static_cast<std::ptrdiff_t>(counters.size()))
      << what.str() << ": merge tickets not reset";
  TANDEM_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TANDEM_CUDA_CHECK(cudaGraphDestroy(graph));
  TANDEM_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(MlaPrewaitCudaTest, PrewaitAndStampsChangeNoBit) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(33);
  // Contexts: mid-tile (1000, 300 + 37), on a tile boundary (1024, 192), short (70).
  const std::vector<std::vector<int32_t>> lens_sets = {{1000}, {1024}, {337, 1024, 70, 192}};
  for (MlaTmaSchedule schedule : {MlaTmaSchedule::kRows16, MlaTmaSchedule::kSerial}) {
    for (int q_len : {1, 2}) {
      for (const std::vector<int32_t>& lens : lens_sets) {
        for (int splits : {1, 2, 0}) {
          RunCase(schedule, q_len, lens, splits, rng);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda
