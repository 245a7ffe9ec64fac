// dcp_bench's MLA layer (RunMlaLayer, dcp_bench_util.h): decode context parallelism for DeepSeek
// multi-head latent attention as runtime/cuda/cuda_mla_model.cc runs it. Per layer a rank runs
//
//   attention   kernels/mla MlaAbsorbedAttention over its 1/dcp of every request's latent rows
//               (W_UK GEMM, the latent kernel with MlaPlanInput::dcp: the shard's partial + LSE,
//               W_UV GEMM), every head of the slice
//   pack, all-to-all, merge   as the GQA layer (dcp_bench_layer.cc), heads of v_head_dim values
//
// and, timed alone for the "lat" columns, the latent kernel (MlaLatentAttention) by itself: the
// part DCP divides (the GEMMs are per token and head, the same on every rank).
//
// Latent pool: bf16 rows of kv_lora_rank + qk_rope_head_dim, block size = DCP interleave, random
// values from fixed seeds and shuffled tables identical on every rank, so the check is the GQA
// layer's: unsharded MlaAbsorbedAttention over the global request those tables describe.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cublas_status.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/attention/cuda/dcp_exchange_cuda.h"
#include "kernels/attention/dcp_exchange.h"
#include "kernels/attention/dcp_shard.h"
#include "kernels/cuda/device_arena.h"
#include "kernels/mla/mla_cuda.h"
#include "runtime/parallel/dcp_bench/dcp_bench_util.h"

namespace tandem::runtime::dcp_bench {
namespace {

using Bf16 = __nv_bfloat16;
namespace kc = ::tandem::kernels::cuda;
using ::tandem::comm::DeviceCommunicator;
using ::tandem::kernels::AttentionBatch;
using ::tandem::kernels::DcpExchangeLayout;
using ::tandem::kernels::DcpShard;
using ::tandem::kernels::MlaDims;
using ::tandem::kernels::cuda::DeviceArena;

// Split-KV partials of one plan (the model's kSplitWorkspaceBytes), cuBLAS's workspace.
constexpr int64_t kSplitBytes = int64_t{256} << 20;
constexpr int64_t kCublasBytes = int64_t{32} << 20;

// A cuBLAS handle with a workspace (needed for graph capture), destroyed with the state.
struct Cublas {
  cublasHandle_t handle = nullptr;
  ~Cublas() {
    if (handle != nullptr) cublasDestroy(handle);
  }
};

struct MlaState {
  kc::DeviceKvCache cache;
  std::vector<int32_t> host_tables;  // [sets][batch][blocks_per_seq] physical block ids
  int32_t *tables = nullptr, *qsl = nullptr, *lens = nullptr, *local_lens = nullptr;
  Bf16 *q = nullptr, *kv_b = nullptr, *q_cat = nullptr, *o_lat = nullptr, *out = nullptr,
       *merged = nullptr;
  float *lse = nullptr, *merged_lse = nullptr;
  uint8_t *workspace = nullptr, *send = nullptr, *recv = nullptr;
  kc::MlaPlan plan;
  DcpExchangeLayout layout;
  Cublas cublas;
  float scale = 0;
};

kc::MlaPlanInput PlanInput(const LayerConfig& c, int64_t max_seq_len, int num_sms) {
  return {.dims = c.shape.mla,
          .num_seqs = c.batch,
          .num_tokens = c.batch,
          .max_q_len = 1,
          .max_seq_len = max_seq_len,
          .num_sms = num_sms,
          .max_workspace_bytes = kSplitBytes};
}

absl::Status SetUp(const LayerConfig& c, const Geometry& g, int num_sms, DeviceArena& arena,
                   MlaState& s, cudaStream_t stream) {
  const MlaDims& d = c.shape.mla;
  const int64_t H = d.num_heads, rows = c.batch * H;
  s.cache.layout = {.num_blocks = g.pool_blocks,
                    .num_layers = 1,
                    .block_size = c.block_size,
                    .num_kv_heads = 1,
                    .head_dim = d.LatentDim(),
                    .num_planes = 1};
  RETURN_IF_ERROR(
      arena.Alloc(g.pool_blocks * g.block_bytes, reinterpret_cast<uint8_t**>(&s.cache.data)));
  RETURN_IF_ERROR(FillRandomBf16(s.cache.data, g.pool_blocks * g.block_bytes));
  s.host_tables.resize(g.pool_blocks);
  std::iota(s.host_tables.begin(), s.host_tables.end(), 0);
  std::mt19937 rng(7);  // the same tables on every rank (the check relies on it)
  std::shuffle(s.host_tables.begin(), s.host_tables.end(), rng);
  std::vector<int32_t> qsl(c.batch + 1), lens(c.batch, static_cast<int32_t>(c.context));
  std::vector<int32_t> local_lens(c.batch, static_cast<int32_t>(g.local));
  std::iota(qsl.begin(), qsl.end(), 0);
  s.layout = {.num_tokens = c.batch,
              .num_heads = H,
              .head_dim = d.v_head_dim,
              .dcp_size = c.dcp,
              .elem_bytes = 2};
  RETURN_IF_ERROR(s.layout.Validate());
  const int64_t kv_b = H * (d.qk_nope_head_dim + d.v_head_dim) * d.kv_lora_rank;
  RETURN_IF_ERROR(arena.Alloc(s.host_tables.size(), &s.tables));
  RETURN_IF_ERROR(arena.Alloc(c.batch + 1, &s.qsl));
  RETURN_IF_ERROR(arena.Alloc(c.batch, &s.lens));
  RETURN_IF_ERROR(arena.Alloc(c.batch, &s.local_lens));
  RETURN_IF_ERROR(arena.Alloc(rows * d.QkHeadDim(), &s.q));
  RETURN_IF_ERROR(arena.Alloc(kv_b, &s.kv_b));
  RETURN_IF_ERROR(arena.Alloc(rows * d.LatentDim(), &s.q_cat));
  RETURN_IF_ERROR(arena.Alloc(rows * d.kv_lora_rank, &s.o_lat));
  RETURN_IF_ERROR(arena.Alloc(rows * d.v_head_dim, &s.out));
  RETURN_IF_ERROR(arena.Alloc(rows, &s.lse));
  RETURN_IF_ERROR(arena.Alloc(rows * d.v_head_dim, &s.merged));
  RETURN_IF_ERROR(arena.Alloc(rows, &s.merged_lse));
  RETURN_IF_ERROR(arena.Alloc(s.layout.BufferBytes(), &s.send));
  RETURN_IF_ERROR(arena.Alloc(s.layout.BufferBytes(), &s.recv));
  RETURN_IF_ERROR(Upload(s.host_tables, s.tables));
  RETURN_IF_ERROR(Upload(qsl, s.qsl));
  RETURN_IF_ERROR(Upload(lens, s.lens));
  RETURN_IF_ERROR(Upload(local_lens, s.local_lens));
  // q and kv_b_proj random (the same on every rank, as DCP replicates them); W_UK scaled so the
  // absorbed queries stay near unit size.
  RETURN_IF_ERROR(FillRandomBf16(s.q, rows * d.QkHeadDim() * 2));
  RETURN_IF_ERROR(
      FillRandomBf16(s.kv_b, kv_b * 2, 1.0f / std::sqrt(static_cast<float>(d.qk_nope_head_dim))));
  s.scale = 1.0f / std::sqrt(static_cast<float>(d.QkHeadDim()));
  kc::MlaPlanInput in = PlanInput(c, g.local_max, num_sms);
  in.dcp = DcpShard{c.dcp, c.rank, c.block_size};
  ASSIGN_OR_RETURN(s.plan, kc::PlanMla(in));
  RETURN_IF_ERROR(arena.Alloc(s.plan.workspace_bytes, &s.workspace));
  CUBLAS_RETURN_IF_ERROR(cublasCreate(&s.cublas.handle));
  uint8_t* cublas_ws = nullptr;
  RETURN_IF_ERROR(arena.Alloc(kCublasBytes, &cublas_ws));
  CUBLAS_RETURN_IF_ERROR(cublasSetWorkspace(s.cublas.handle, cublas_ws, kCublasBytes));
  // q_cat for the latent kernel timed alone: the absorbed queries of q.
  RETURN_IF_ERROR(
      kc::MlaAbsorbQuery<Bf16>(s.cublas.handle, s.q, s.kv_b, d, c.batch, s.q_cat, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

struct MlaSteps {
  Step attention, latent, pack, all_to_all, merge, layer;
};

MlaSteps MakeSteps(const LayerConfig& c, const Geometry& g, MlaState& s, DeviceCommunicator* comm,
                   cudaStream_t stream) {
  const int64_t set_entries = c.batch * g.blocks_per_seq;
  auto batch = [&c, &g, &s, set_entries](int i) {
    return AttentionBatch{.query_start_loc = s.qsl,
                          .seq_lens = s.lens,
                          .block_tables = s.tables + (i % g.sets) * set_entries,
                          .num_seqs = c.batch,
                          .max_blocks_per_seq = g.blocks_per_seq,
                          .local_seq_lens = s.local_lens};
  };
  MlaSteps st;
  st.attention = [&s, batch, stream](int i) {
    return kc::MlaAbsorbedAttention<Bf16>(s.cublas.handle, s.q, s.kv_b, s.cache, 0, batch(i),
                                          s.scale, s.plan, s.workspace, s.out, s.lse, stream);
  };
  st.latent = [&s, batch, stream](int i) {
    return kc::MlaLatentAttention<Bf16>(s.q_cat, s.cache, 0, batch(i), s.scale, s.plan, s.workspace,
                                        s.o_lat, s.lse, stream);
  };
  SetExchangeSteps(s, comm, stream, st);
  return st;
}

// One eager layer over table set 0 against unsharded MlaAbsorbedAttention over the global request
// of the ranks' identical pools and tables (global block b of request r: physical block
// table0[r][b / dcp], as dcp_bench_layer.cc's Check). max |merged - ref| / max |ref| over this
// rank's heads.
absl::StatusOr<double> Check(const LayerConfig& c, const Geometry& g, MlaState& s,
                             const MlaSteps& st, Timer& timer, int num_sms, DeviceArena& arena,
                             cudaStream_t stream) {
  RETURN_IF_ERROR(st.layer(0));
  RETURN_IF_ERROR(timer.Wait());
  const MlaDims& d = c.shape.mla;
  const int64_t global_blocks = (c.context + c.block_size - 1) / c.block_size;
  std::vector<int32_t> global(c.batch * global_blocks);
  for (int64_t r = 0; r < c.batch; ++r) {
    for (int64_t b = 0; b < global_blocks; ++b) {
      global[r * global_blocks + b] = s.host_tables[r * g.blocks_per_seq + b / c.dcp];
    }
  }
  int32_t* global_tables;
  Bf16* ref;
  const int64_t rows = c.batch * d.num_heads, dv = d.v_head_dim;
  RETURN_IF_ERROR(arena.Alloc(global.size(), &global_tables));
  RETURN_IF_ERROR(arena.Alloc(rows * dv, &ref));
  RETURN_IF_ERROR(Upload(global, global_tables));
  ASSIGN_OR_RETURN(const kc::MlaPlan plan, kc::PlanMla(PlanInput(c, c.context, num_sms)));
  uint8_t* workspace = nullptr;
  RETURN_IF_ERROR(arena.Alloc(plan.workspace_bytes, &workspace));
  const AttentionBatch b{.query_start_loc = s.qsl,
                         .seq_lens = s.lens,
                         .block_tables = global_tables,
                         .num_seqs = c.batch,
                         .max_blocks_per_seq = global_blocks};
  RETURN_IF_ERROR(kc::MlaAbsorbedAttention<Bf16>(s.cublas.handle, s.q, s.kv_b, s.cache, 0, b,
                                                 s.scale, plan, workspace, ref, nullptr, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  const int64_t hpr = s.layout.HeadsPerRank();
  ASSIGN_OR_RETURN(const std::vector<float> want, Download(ref, rows * dv));
  ASSIGN_OR_RETURN(const std::vector<float> got, Download(s.merged, c.batch * hpr * dv));
  return RankSliceRelError(want, got, c.batch, d.num_heads, c.rank, hpr, dv);
}

absl::StatusOr<LayerTimes> Measure(const LayerConfig& c, const Geometry& g, MlaState& s,
                                   DeviceCommunicator* comm, int num_sms, DeviceArena& arena,
                                   cudaStream_t stream) {
  const MlaSteps st = MakeSteps(c, g, s, comm, stream);
  Timer timer(stream, comm, c.graphs, ItersFor(c));
  LayerTimes t;
  t.num_splits = s.plan.num_splits;
  ASSIGN_OR_RETURN(t.attention_us, timer.Us(st.attention));
  ASSIGN_OR_RETURN(t.latent_us, timer.Us(st.latent));
  if (c.dcp == 1) {
    t.layer_us = t.attention_us;
    return t;
  }
  ASSIGN_OR_RETURN(t.pack_us, timer.Us(st.pack));
  ASSIGN_OR_RETURN(t.all_to_all_us, timer.Us(st.all_to_all));
  ASSIGN_OR_RETURN(t.merge_us, timer.Us(st.merge));
  ASSIGN_OR_RETURN(t.layer_us, timer.Us(st.layer));
  if (c.check) {
    ASSIGN_OR_RETURN(t.max_rel_err, Check(c, g, s, st, timer, num_sms, arena, stream));
  }
  return t;
}

}  // namespace

int64_t MlaDeviceBytes(const LayerConfig& c) {
  const MlaDims& d = c.shape.mla;
  const int64_t rows = c.batch * d.num_heads;
  // Two plans' workspaces (sharded, the check's), kv_b_proj, q_cat / o_lat, cuBLAS's workspace.
  return 2 * (kSplitBytes + rows * (d.LatentDim() + d.kv_lora_rank) * 2) +
         d.num_heads * (d.qk_nope_head_dim + d.v_head_dim) * d.kv_lora_rank * 2 +
         rows * (d.LatentDim() + d.kv_lora_rank) * 2 + kCublasBytes;
}

absl::StatusOr<LayerTimes> RunMlaLayer(const LayerConfig& c, DeviceCommunicator* comm,
                                       int num_sms) {
  const Geometry g = GeometryOf(c);
  cudaStream_t stream;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  absl::StatusOr<LayerTimes> times;
  {
    DeviceArena arena;
    MlaState s;
    const absl::Status set_up = SetUp(c, g, num_sms, arena, s, stream);
    if (set_up.ok()) {
      times = Measure(c, g, s, comm, num_sms, arena, stream);
    } else {
      times = set_up;
    }
    cudaStreamSynchronize(stream);
  }
  cudaStreamDestroy(stream);
  return times;
}

}  // namespace tandem::runtime::dcp_bench
