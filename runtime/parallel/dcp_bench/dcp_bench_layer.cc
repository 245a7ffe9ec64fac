#include "runtime/parallel/dcp_bench/dcp_bench_layer.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/attention/cuda/dcp_exchange_cuda.h"
#include "kernels/attention/cuda/paged_attention_cuda.h"
#include "kernels/attention/dcp_exchange.h"
#include "kernels/attention/dcp_shard.h"
#include "kernels/cuda/device_arena.h"
#include "runtime/parallel/dcp_bench/dcp_bench_util.h"

namespace tandem::runtime::dcp_bench {

Geometry GeometryOf(const LayerConfig& c) {
  Geometry g;
  g.local_max = DcpLocalCount(c.context, kernels::DcpShard{c.dcp, 0, c.block_size});
  g.local = DcpLocalCount(c.context, kernels::DcpShard{c.dcp, c.rank, c.block_size});
  g.blocks_per_seq = (g.local_max + c.block_size - 1) / c.block_size;
  g.block_bytes = c.block_size * c.shape.KvBytesPerToken();
  const int64_t batch_bytes = std::max<int64_t>(1, c.batch * g.blocks_per_seq * g.block_bytes);
  g.sets = std::clamp<int64_t>((kRotateBytes + batch_bytes - 1) / batch_bytes, 1, kMaxSets);
  g.pool_blocks = g.sets * c.batch * g.blocks_per_seq;
  return g;
}

// Layers per measurement: about 20 ms of attention at ~3 TB/s, 20..500.
int ItersFor(const LayerConfig& c) {
  if (c.iters > 0) return c.iters;
  const double attention_s = static_cast<double>(KvBytesPerRank(c)) / 3e12;
  return static_cast<int>(std::clamp(20e-3 / std::max(attention_s, 1e-9), 20.0, 500.0));
}

namespace {

using Bf16 = __nv_bfloat16;
namespace kc = ::tandem::kernels::cuda;
using ::tandem::comm::DeviceCommunicator;
using ::tandem::kernels::AttentionBatch;
using ::tandem::kernels::AttentionParams;
using ::tandem::kernels::DcpExchangeLayout;
using ::tandem::kernels::DcpLocalCount;
using ::tandem::kernels::DcpShard;
using ::tandem::kernels::cuda::DeviceArena;

// Device state of one config on this rank.
struct LayerState {
  kc::DeviceKvCache cache;
  std::vector<int32_t> host_tables;  // [sets][batch][blocks_per_seq] physical block ids
  int32_t *tables = nullptr, *qsl = nullptr, *lens = nullptr, *local_lens = nullptr;
  Bf16 *q = nullptr, *out = nullptr, *merged = nullptr;
  float *lse = nullptr, *merged_lse = nullptr;
  uint8_t *workspace = nullptr, *send = nullptr, *recv = nullptr;
  kc::PagedAttentionPlan plan;
  DcpExchangeLayout layout;
};

absl::Status SetUp(const LayerConfig& c, const Geometry& g, int num_sms, DeviceArena& arena,
                   LayerState& s) {
  const ModelShape& m = c.shape;
  s.cache.layout = {.num_blocks = g.pool_blocks,
                    .num_layers = 1,
                    .block_size = c.block_size,
                    .num_kv_heads = m.num_kv_heads,
                    .head_dim = m.head_dim};
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
              .num_heads = m.num_q_heads,
              .head_dim = m.head_dim,
              .dcp_size = c.dcp,
              .elem_bytes = 2};
  RETURN_IF_ERROR(s.layout.Validate());
  const int64_t rows = c.batch * m.num_q_heads;
  RETURN_IF_ERROR(arena.Alloc(s.host_tables.size(), &s.tables));
  RETURN_IF_ERROR(arena.Alloc(c.batch + 1, &s.qsl));
  RETURN_IF_ERROR(arena.Alloc(c.batch, &s.lens));
  RETURN_IF_ERROR(arena.Alloc(c.batch, &s.local_lens));
  RETURN_IF_ERROR(arena.Alloc(rows * m.head_dim, &s.q));
  RETURN_IF_ERROR(arena.Alloc(rows * m.head_dim, &s.out));
  RETURN_IF_ERROR(arena.Alloc(rows, &s.lse));
  RETURN_IF_ERROR(arena.Alloc(rows * m.head_dim, &s.merged));
  RETURN_IF_ERROR(arena.Alloc(rows, &s.merged_lse));
  RETURN_IF_ERROR(arena.Alloc(s.layout.BufferBytes(), &s.send));
  RETURN_IF_ERROR(arena.Alloc(s.layout.BufferBytes(), &s.recv));
  RETURN_IF_ERROR(Upload(s.host_tables, s.tables));
  RETURN_IF_ERROR(Upload(qsl, s.qsl));
  RETURN_IF_ERROR(Upload(lens, s.lens));
  RETURN_IF_ERROR(Upload(local_lens, s.local_lens));
  // q: random values from the pool (the same on every rank, as DCP replicates q).
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(s.q, s.cache.data, rows * m.head_dim * 2, cudaMemcpyDeviceToDevice));
  ASSIGN_OR_RETURN(s.plan, kc::PlanPagedAttention({.num_seqs = c.batch,
                                                   .num_tokens = c.batch,
                                                   .max_q_len = 1,
                                                   .max_seq_len = g.local_max,
                                                   .num_q_heads = m.num_q_heads,
                                                   .num_kv_heads = m.num_kv_heads,
                                                   .head_dim = m.head_dim,
                                                   .kv_dtype = kc::KvDtype::kBf16,
                                                   .num_sms = num_sms}));
  if (s.plan.workspace_bytes > 0) {
    RETURN_IF_ERROR(arena.Alloc(s.plan.workspace_bytes, &s.workspace));
  }
  return absl::OkStatus();
}

// The layer's four parts as steps over one config's state.
struct LayerSteps {
  Step attention, pack, all_to_all, merge, layer;
};

LayerSteps MakeSteps(const LayerConfig& c, const Geometry& g, const LayerState& s,
                     DeviceCommunicator* comm, cudaStream_t stream) {
  AttentionParams params{.scale = 1.0f / std::sqrt(static_cast<float>(c.shape.head_dim))};
  params.dcp_size = c.dcp;
  params.dcp_rank = c.rank;
  params.dcp_interleave = c.block_size;
  const int64_t set_entries = c.batch * g.blocks_per_seq;
  LayerSteps st;
  st.attention = [&c, &g, &s, params, set_entries, stream](int i) {
    const AttentionBatch b{.query_start_loc = s.qsl,
                           .seq_lens = s.lens,
                           .block_tables = s.tables + (i % g.sets) * set_entries,
                           .num_seqs = c.batch,
                           .max_blocks_per_seq = g.blocks_per_seq,
                           .local_seq_lens = s.local_lens};
    return kc::PagedAttention<Bf16>(s.q, s.cache, 0, b, params, s.plan, s.out, s.lse, s.workspace,
                                    stream);
  };
  SetExchangeSteps(s, comm, stream, st);
  return st;
}

// One eager layer over table set 0, then unsharded attention over the global request that the
// ranks' identical pools and tables describe: global block b of request r is rank b % dcp's
// local block b / dcp, i.e. physical block table0[r][b / dcp] on every rank. Returns
// max |merged - reference| / max |reference| over this rank's heads.
absl::StatusOr<double> Check(const LayerConfig& c, const Geometry& g, const LayerState& s,
                             const LayerSteps& st, Timer& timer, int num_sms, DeviceArena& arena,
                             cudaStream_t stream) {
  RETURN_IF_ERROR(st.layer(0));
  RETURN_IF_ERROR(timer.Wait());
  const ModelShape& m = c.shape;
  const int64_t global_blocks = (c.context + c.block_size - 1) / c.block_size;
  std::vector<int32_t> global(c.batch * global_blocks);
  for (int64_t r = 0; r < c.batch; ++r) {
    for (int64_t b = 0; b < global_blocks; ++b) {
      global[r * global_blocks + b] = s.host_tables[r * g.blocks_per_seq + b / c.dcp];
    }
  }
  int32_t* global_tables;
  Bf16* ref;
  const int64_t rows = c.batch * m.num_q_heads;
  RETURN_IF_ERROR(arena.Alloc(global.size(), &global_tables));
  RETURN_IF_ERROR(arena.Alloc(rows * m.head_dim, &ref));
  RETURN_IF_ERROR(Upload(global, global_tables));
  kc::PagedAttentionPlanInput in = s.plan.input;
  in.max_seq_len = c.context;
  in.num_sms = num_sms;
  ASSIGN_OR_RETURN(const kc::PagedAttentionPlan plan, kc::PlanPagedAttention(in));
  uint8_t* workspace = nullptr;
  if (plan.workspace_bytes > 0) RETURN_IF_ERROR(arena.Alloc(plan.workspace_bytes, &workspace));
  const AttentionBatch b{.query_start_loc = s.qsl,
                         .seq_lens = s.lens,
                         .block_tables = global_tables,
                         .num_seqs = c.batch,
                         .max_blocks_per_seq = global_blocks};
  const AttentionParams params{.scale = 1.0f / std::sqrt(static_cast<float>(m.head_dim))};
  RETURN_IF_ERROR(
      kc::PagedAttention<Bf16>(s.q, s.cache, 0, b, params, plan, ref, nullptr, workspace, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  const int64_t hpr = s.layout.HeadsPerRank(), d = m.head_dim;
  ASSIGN_OR_RETURN(const std::vector<float> want, Download(ref, rows * d));
  ASSIGN_OR_RETURN(const std::vector<float> got, Download(s.merged, c.batch * hpr * d));
  return RankSliceRelError(want, got, c.batch, m.num_q_heads, c.rank, hpr, d);
}

absl::StatusOr<LayerTimes> Measure(const LayerConfig& c, const Geometry& g, const LayerState& s,
                                   DeviceCommunicator* comm, int num_sms, DeviceArena& arena,
                                   cudaStream_t stream) {
  const LayerSteps st = MakeSteps(c, g, s, comm, stream);
  Timer timer(stream, comm, c.graphs, ItersFor(c));
  LayerTimes t;
  t.num_splits = s.plan.num_splits;
  ASSIGN_OR_RETURN(t.attention_us, timer.Us(st.attention));
  if (c.dcp == 1) {
    t.layer_us = t.attention_us;  // no exchange without context parallelism
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

absl::StatusOr<ModelShape> ShapeByName(const std::string& name) {
  ModelShape s;
  s.name = name;
  s.head_dim = 128;
  if (name == "llama3-8b" || name == "llama3-70b") {
    const bool big = name == "llama3-70b";
    s.num_q_heads = big ? 64 : 32;
    s.num_kv_heads = 8;
    s.num_layers = big ? 80 : 32;
    return s;
  }
  if (name == "deepseek-v3") {
    s.mla = {.num_heads = 128,
             .qk_nope_head_dim = 128,
             .qk_rope_head_dim = 64,
             .kv_lora_rank = 512,
             .v_head_dim = 128};
    s.num_q_heads = s.mla.num_heads;
    s.num_kv_heads = 1;
    s.head_dim = s.mla.LatentDim();
    s.num_layers = 61;
    return s;
  }
  return absl::InvalidArgumentError(absl::StrCat("--shape: unknown model shape '", name,
                                                 "' (llama3-8b, llama3-70b or deepseek-v3)"));
}

int64_t KvBytesPerRank(const LayerConfig& c) {
  return c.batch * GeometryOf(c).local_max * c.shape.KvBytesPerToken();
}

int64_t LocalTokens(const LayerConfig& c) { return GeometryOf(c).local_max; }

int64_t DeviceBytesNeeded(const LayerConfig& c) {
  const Geometry g = GeometryOf(c);
  const int64_t rows = c.batch * c.shape.num_q_heads;
  const int64_t mla = c.shape.IsMla() ? MlaDeviceBytes(c) : 0;
  return g.pool_blocks * g.block_bytes + 6 * rows * c.shape.head_dim * 4 + mla + kMarginBytes;
}

absl::StatusOr<LayerTimes> RunLayer(const LayerConfig& c, DeviceCommunicator* comm, int num_sms) {
  if (c.dcp < 1 || c.rank < 0 || c.rank >= c.dcp || c.batch < 1 || c.context < 1 ||
      c.block_size < 1 || c.shape.num_q_heads % c.dcp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dcp_bench: bad config (batch ", c.batch, ", context ", c.context, ", dcp ",
                     c.dcp, ", rank ", c.rank, ", ", c.shape.num_q_heads, " query heads)"));
  }
  if ((comm == nullptr) != (c.dcp == 1) ||
      (comm != nullptr && (comm->size() != c.dcp || comm->rank() != c.rank))) {
    return absl::InvalidArgumentError("dcp_bench: the communicator does not match the config");
  }
  if (c.graphs && comm != nullptr && !comm->graph_capturable()) {
    return absl::InvalidArgumentError(absl::StrCat("dcp_bench: the ", std::string(comm->backend()),
                                                   " communicator is not capturable"));
  }
  if (c.shape.IsMla()) return RunMlaLayer(c, comm, num_sms);
  const Geometry g = GeometryOf(c);
  DeviceArena arena;
  LayerState s;
  RETURN_IF_ERROR(SetUp(c, g, num_sms, arena, s));
  cudaStream_t stream;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  absl::StatusOr<LayerTimes> times = Measure(c, g, s, comm, num_sms, arena, stream);
  cudaStreamDestroy(stream);
  return times;
}

}  // namespace tandem::runtime::dcp_bench
