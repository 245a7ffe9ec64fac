// kRows16's cluster merge (MlaPlanInput::cluster_merge: the split CTAs of a group form one
// thread-block cluster and merge through DSMEM) changes no bit: MlaLatentAttention with the
// cluster plan equals the same plan with the in-kernel ticket merge (o_lat and LSE, memcmp), both
// match the CPU reference cpu::MlaPagedAttention, a CUDA graph of the cluster call replays the
// same bits twice, and the plan falls back (MlaPlan::cluster_merge false, today's merge) where
// the cluster is invalid (1 split, > 16 splits, another schedule). The CPU reference runs the
// absorbed path with W_UK = W_UV = identity (Dn = Dv = L), so its output is o_lat. Random
// inputs (never zeros); bf16 and fp16; 16 and 8 heads; q_len 1 and 2; splits 2 / 4 / 8 / 16
// forced and planned; contexts 1 .. 4097 (splits past a short request's context: empty in the
// cluster); batch 1, 3 and 4. Skips without a GPU; off sm_90 the plan's cluster merge is not
// taken (the comparisons still hold).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/attention/attention_test_util.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/mla/mla_attention.h"
#include "kernels/mla/mla_cuda.h"
#include "kernels/mla/mla_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using cuda_test::DeviceBuffer;

// nope = v = 512 so that identity W_UK / W_UV make the CPU's output o_lat.
MlaDims DimsOf(int64_t heads) {
  return MlaDims{.num_heads = heads,
                 .qk_nope_head_dim = 512,
                 .qk_rope_head_dim = 64,
                 .kv_lora_rank = 512,
                 .v_head_dim = 512};
}

bool Sm90() {
  cudaDeviceProp prop;
  return cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major == 9;
}

template <typename T>
struct Result {
  std::vector<T> o;
  std::vector<float> lse;
  bool operator==(const Result& b) const {
    return o.size() == b.o.size() && lse.size() == b.lse.size() &&
           std::memcmp(o.data(), b.o.data(), o.size() * sizeof(T)) == 0 &&
           std::memcmp(lse.data(), b.lse.data(), lse.size() * sizeof(float)) == 0;
  }
};

// One batch (pool, queries, the CPU's o_lat / LSE) and its device buffers.
template <typename T>
class Batch {
 public:
  Batch(int64_t heads, int q_len, const std::vector<int32_t>& lens, std::mt19937& rng)
      : dims_(DimsOf(heads)), q_len_(q_len), lens_(lens) {
    const int64_t S = static_cast<int64_t>(lens.size()), H = heads, bs = 64;
    const int64_t D = dims_.LatentDim(), L = dims_.kv_lora_rank;
    pages_ = mla_test::ShufflePages(lens, bs, rng);
    layout_ = pages_.Layout(bs, D);
    const int64_t n_lat = static_cast<int64_t>(pages_.slots.size());
    tokens_ = S * q_len;
    qsl_.resize(S + 1);
    for (int64_t s = 0; s <= S; ++s) qsl_[s] = static_cast<int32_t>(s * q_len);
    std::vector<float> latent = attention_test::RandomNormal(rng, n_lat * D, 1.0f);
    std::vector<float> q = attention_test::RandomNormal(rng, tokens_ * H * D, 1.0f);
    cuda_test::RoundTo<T>(latent);
    cuda_test::RoundTo<T>(q);
    std::vector<float> pool(layout_.TotalElems(), 0.5f);
    EXPECT_TRUE(
        cpu::WriteLatentCache(latent.data(), pages_.slots.data(), n_lat, 1, {pool.data(), layout_})
            .ok());
    std::vector<float> kv_b(H * 2 * L * L, 0.0f);  // W_UK = W_UV = identity
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < L; ++i) {
        kv_b[(h * 2 * L + i) * L + i] = 1.0f;
        kv_b[(h * 2 * L + L + i) * L + i] = 1.0f;
      }
    }
    AttentionBatch hb{qsl_.data(), lens_.data(), pages_.tables.data(), S, pages_.max_blocks};
    want_.resize(tokens_ * H * L);
    want_lse_.resize(tokens_ * H);
    EXPECT_TRUE(cpu::MlaPagedAttention(q.data(), kv_b.data(), dims_, {pool.data(), layout_}, 1, hb,
                                       scale_, MlaMode::kAbsorbed, want_.data(), want_lse_.data(),
                                       nullptr)
                    .ok());
    pool_d_.emplace(cuda_test::Convert<T>(pool));
    q_d_.emplace(cuda_test::Convert<T>(q));
    o_d_.emplace(tokens_ * H * L);
    lse_d_.emplace(tokens_ * H);
    qsl_d_.emplace(qsl_);
    lens_d_.emplace(lens_);
    tables_d_.emplace(pages_.tables);
  }

  MlaPlanInput Input(int splits, MlaTmaSchedule schedule, bool cluster) const {
    return MlaPlanInput{.dims = dims_,
                        .num_seqs = static_cast<int64_t>(lens_.size()),
                        .num_tokens = tokens_,
                        .max_q_len = q_len_,
                        .max_seq_len = pages_.max_len,
                        .num_splits = splits,
                        .tma_schedule = schedule,
                        .workspace_zeroed = true,
                        .cluster_merge = cluster,
                        // every valid case checked, in as many waves as it takes
                        .cluster_merge_one_wave = false};
  }

  absl::Status Call(const MlaPlan& plan, void* ws, cudaStream_t stream) {
    const DeviceKvCache cache{pool_d_->get(), layout_,
                              std::is_same_v<T, __half> ? KvDtype::kFp16 : KvDtype::kBf16};
    const AttentionBatch db{qsl_d_->get(), lens_d_->get(), tables_d_->get(),
                            static_cast<int64_t>(lens_.size()), pages_.max_blocks};
    return MlaLatentAttention<T>(q_d_->get(), cache, 1, db, scale_, plan, ws, o_d_->get(),
                                 lse_d_->get(), stream);
  }

  // The results after `stream`'s work; then poisons the outputs (0xff: NaN) for the next call.
  Result<T> Fetch(cudaStream_t stream) {
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    Result<T> r{o_d_->ToHost(), lse_d_->ToHost()};
    EXPECT_EQ(cudaMemset(o_d_->get(), 0xff, o_d_->size() * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemset(lse_d_->get(), 0xff, lse_d_->size() * sizeof(float)), cudaSuccess);
    return r;
  }

  void ExpectNearCpu(const Result<T>& r, const std::string& what) const {
    float max_ref = 0.0f, max_err = 0.0f, max_lse_err = 0.0f;
    for (size_t i = 0; i < want_.size(); ++i) {
      max_ref = std::max(max_ref, std::abs(want_[i]));
      max_err = std::max(max_err, std::abs(cuda_test::ToF(r.o[i]) - want_[i]));
    }
    for (size_t i = 0; i < want_lse_.size(); ++i) {
      max_lse_err = std::max(max_lse_err, std::abs(r.lse[i] - want_lse_[i]));
    }
    EXPECT_GT(max_ref, 0.0f) << what;
    EXPECT_LE(max_err, 2.5e-2f * max_ref) << what;  // NaN fails too
    EXPECT_LE(max_lse_err, 2e-2f) << what;
  }

 private:
  MlaDims dims_;
  int q_len_;
  std::vector<int32_t> lens_, qsl_;
  mla_test::ShuffledPages pages_;
  KvCacheLayout layout_;
  int64_t tokens_ = 0;
  float scale_ = 1.0f / std::sqrt(576.0f);
  std::vector<float> want_, want_lse_;
  std::optional<DeviceBuffer<T>> pool_d_, q_d_, o_d_;  // (DeviceBuffer has no move assignment)
  std::optional<DeviceBuffer<float>> lse_d_;
  std::optional<DeviceBuffer<int32_t>> qsl_d_, lens_d_, tables_d_;
};

// The workspace for every plan of a batch (the tickets zeroed, the rest poisoned).
struct Workspace {
  explicit Workspace(int64_t bytes) : buf(bytes) {
    EXPECT_EQ(cudaMemset(buf.get(), 0xff, bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(buf.get(), 0, kMlaMergeCounterBytes), cudaSuccess);
  }
  DeviceBuffer<unsigned char> buf;
};

// The cluster plan against the ticket plan of the same splits, the CPU, and a graph replay.
template <typename T>
void RunSplits(Batch<T>& batch, int splits, cudaStream_t stream, const std::string& name) {
  absl::StatusOr<MlaPlan> ticket = PlanMla(batch.Input(splits, MlaTmaSchedule::kRows16, false));
  absl::StatusOr<MlaPlan> cluster = PlanMla(batch.Input(splits, MlaTmaSchedule::kRows16, true));
  ASSERT_TRUE(ticket.ok() && cluster.ok()) << ticket.status() << cluster.status();
  ASSERT_EQ(ticket->num_splits, cluster->num_splits);
  EXPECT_FALSE(ticket->cluster_merge);
  std::ostringstream what;
  what << name << " splits " << cluster->num_splits << " (asked " << splits << "), cluster "
       << cluster->cluster_merge;
  if (cluster->cluster_merge_fallback != nullptr)
    what << " (" << cluster->cluster_merge_fallback << ")";
  const bool valid = cluster->num_splits >= 2 && cluster->num_splits <= 16;
  if (!valid) {
    EXPECT_FALSE(cluster->cluster_merge) << what.str();
  } else if (Sm90() && cluster->num_splits <= 8) {  // 16: where the device has room for it
    EXPECT_TRUE(cluster->cluster_merge) << what.str();
  }
  Workspace ws(std::max(ticket->workspace_bytes, cluster->workspace_bytes));
  ASSERT_TRUE(batch.Call(*ticket, ws.buf.get(), stream).ok());
  const Result<T> base = batch.Fetch(stream);
  batch.ExpectNearCpu(base, what.str() + " (tickets)");
  ASSERT_TRUE(batch.Call(*cluster, ws.buf.get(), stream).ok());
  const Result<T> got = batch.Fetch(stream);
  EXPECT_TRUE(got == base) << what.str() << ": the cluster merge differs from the ticket merge";
  batch.ExpectNearCpu(got, what.str());
  // Two cluster calls in one graph, replayed twice.
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  absl::Status st = batch.Call(*cluster, ws.buf.get(), stream);
  if (st.ok()) st = batch.Call(*cluster, ws.buf.get(), stream);
  cudaGraph_t graph = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(st.ok()) << st;
  cudaGraphExec_t exec = nullptr;
  TANDEM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int r = 0; r < 2; ++r) {
    TANDEM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    EXPECT_TRUE(batch.Fetch(stream) == base) << what.str() << ": graph replay " << r << " differs";
  }
  TANDEM_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TANDEM_CUDA_CHECK(cudaGraphDestroy(graph));
  std::cout << what.str() << ": same bits\n";
}

template <typename T>
void RunAll(const char* type_name, std::mt19937& rng) {
  cudaStream_t stream = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamCreate(&stream));
  // Contexts 1 (2 at q_len 2) .. 4097: one latent, a partial tile, a tile boundary, long;
  // batches of 1, 3, 4 (a short request next to long ones leaves most of its cluster's splits
  // empty).
  const std::vector<std::vector<int32_t>> lens_sets = {
      {4097}, {1000}, {5, 4097, 700}, {1, 130, 2049, 64}};
  for (int64_t heads : {16, 8}) {
    for (int q_len : {1, 2}) {
      for (std::vector<int32_t> lens : lens_sets) {
        for (int32_t& len : lens) len = std::max(len, q_len);  // a request sees its own tokens
        Batch<T> batch(heads, q_len, lens, rng);
        std::ostringstream name;
        name << type_name << " heads " << heads << " q_len " << q_len << " lens " << lens[0] << " ("
             << lens.size() << " requests)";
        for (int splits : {2, 4, 8, 16, 0}) {
          RunSplits(batch, splits, stream, name.str());
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
  TANDEM_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(MlaClusterMergeCudaTest, Bf16SameBitsAsTicketMerge) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(16);
  RunAll<__nv_bfloat16>("bf16", rng);
}

TEST(MlaClusterMergeCudaTest, Fp16SameBitsAsTicketMerge) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(17);
  RunAll<__half>("fp16", rng);
}

// Where a cluster is invalid the plan keeps today's merge: 1 split, 32 splits, kSerial.
TEST(MlaClusterMergeCudaTest, FallsBackWhereInvalid) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(18);
  cudaStream_t stream = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamCreate(&stream));
  Batch<__nv_bfloat16> batch(16, 1, {4097, 70}, rng);
  struct Case {
    int splits;
    MlaTmaSchedule schedule;
  };
  for (const Case& c : {Case{1, MlaTmaSchedule::kRows16}, Case{32, MlaTmaSchedule::kRows16},
                        Case{4, MlaTmaSchedule::kSerial}}) {
    absl::StatusOr<MlaPlan> plain = PlanMla(batch.Input(c.splits, c.schedule, false));
    absl::StatusOr<MlaPlan> asked = PlanMla(batch.Input(c.splits, c.schedule, true));
    ASSERT_TRUE(plain.ok() && asked.ok());
    EXPECT_FALSE(asked->cluster_merge) << "splits " << c.splits;
    EXPECT_NE(asked->cluster_merge_fallback, nullptr) << "splits " << c.splits;
    EXPECT_EQ(plain->cluster_merge_fallback, nullptr);
    if (asked->cluster_merge_fallback != nullptr) {
      std::cout << "splits " << asked->num_splits << ": " << asked->cluster_merge_fallback << "\n";
    }
    EXPECT_EQ(asked->num_splits, plain->num_splits);
    EXPECT_EQ(asked->merge_in_kernel, plain->merge_in_kernel);
    Workspace ws(asked->workspace_bytes);
    ASSERT_TRUE(batch.Call(*plain, ws.buf.get(), stream).ok());
    const Result<__nv_bfloat16> base = batch.Fetch(stream);
    batch.ExpectNearCpu(base, "fallback");
    ASSERT_TRUE(batch.Call(*asked, ws.buf.get(), stream).ok());
    EXPECT_TRUE(batch.Fetch(stream) == base) << "fallback splits " << c.splits;
  }
  TANDEM_CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace tandem::kernels::cuda
