// One rank's part of dcp_bench (dcp_bench.cc): one simulated decode layer of decode context
// parallelism on the current CUDA device, timed part by part. Per layer a rank runs
//
//   shard attention   kernels/attention/cuda PagedAttention over its 1/dcp of every request's KV
//                     (AttentionParams::dcp_*, global positions, local block tables)
//   pack              DcpPackForExchange: (out, lse) of all heads into one buffer
//   all-to-all        ONE comm::DeviceCommunicator::AllToAll of that buffer
//   merge             DcpMergeReceived: the rank's heads / dcp heads, merged by LSE
//
// as kernels/attention/dcp_exchange.h lays it out. Every rank attends all query heads (TP_A 1).
//
// KV: a bf16 pool per rank with only that rank's tokens (ctx / dcp per request), random normal
// values (never zero) and shuffled block tables, rotated over several copies when one call's KV
// would fit in L2. The pool contents, q and the tables come from fixed seeds, so they are the
// same on every rank: rank k's local block j is then global block j * dcp + k of one global
// request whose block table is known, which is what the check compares against (unsharded
// PagedAttention over that global table, on the same pool).
//
// Thread safety: RunLayer uses the calling thread's current device and its own stream.
#ifndef TANDEM_RUNTIME_PARALLEL_DCP_BENCH_DCP_BENCH_LAYER_H_
#define TANDEM_RUNTIME_PARALLEL_DCP_BENCH_DCP_BENCH_LAYER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "comm/device_communicator.h"
#include "kernels/mla/mla_attention.h"

namespace tandem::runtime::dcp_bench {

// A model's attention geometry (per layer; every rank keeps every head).
struct ModelShape {
  std::string name;
  int64_t num_q_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t num_layers = 0;  // turns one layer's time into a decode step's attention time
  // DeepSeek MLA (mla.kv_lora_rank > 0; dcp_bench_mla.cc): the KV is one latent row of
  // kv_lora_rank + qk_rope_head_dim per token (num_kv_heads 1, head_dim that width), the heads'
  // outputs (what the exchange moves) mla.v_head_dim wide.
  kernels::MlaDims mla = {};
  bool IsMla() const { return mla.kv_lora_rank > 0; }
  // KV bytes per token of one layer (bf16): K + V, or the latent row.
  int64_t KvBytesPerToken() const { return (IsMla() ? 1 : 2) * num_kv_heads * head_dim * 2; }
  // Width of one head's attention output.
  int64_t OutHeadDim() const { return IsMla() ? mla.v_head_dim : head_dim; }
};

// "llama3-8b" (32 q / 8 kv heads, d128, 32 layers), "llama3-70b" (64 q / 8 kv heads, d128, 80
// layers) or "deepseek-v3" (MLA: 128 heads, latent 512 + 64, nope 128, v 128, 61 layers);
// INVALID_ARGUMENT otherwise.
absl::StatusOr<ModelShape> ShapeByName(const std::string& name);

struct LayerConfig {
  ModelShape shape;
  int64_t batch = 1;        // decode requests, one new token each
  int64_t context = 0;      // every request's global length (its query sits at context - 1)
  int64_t dcp = 1;          // KV shards = ranks of the exchange
  int64_t rank = 0;         // this rank's shard, in [0, dcp)
  int64_t block_size = 16;  // also the DCP interleave (whole blocks per shard)
  int iters = 0;            // layers per measurement; 0: about 20 ms of attention, 20..500
  bool graphs = true;       // CUDA-graph replay (needs a capturable communicator); else eager
  bool check = true;        // compare the merged heads with unsharded attention (dcp > 1)
};

// K + V (or latent) bytes of one layer that rank 0 (the most loaded) holds for the whole batch
// (bf16), and its tokens of one request.
int64_t KvBytesPerRank(const LayerConfig& c);
int64_t LocalTokens(const LayerConfig& c);
// Device memory RunLayer allocates, with a margin for plan workspaces.
int64_t DeviceBytesNeeded(const LayerConfig& c);

// One rank's numbers for one config: microseconds per layer, -1 where not run.
struct LayerTimes {
  double attention_us = -1;   // shard attention alone
  double pack_us = -1;        // pack alone
  double all_to_all_us = -1;  // the all-to-all alone
  double merge_us = -1;       // merge alone
  double layer_us = -1;       // the four in sequence (attention alone when dcp == 1)
  double max_rel_err = -1;    // check: max |merged - unsharded| / max |unsharded|; -1 not run
  int num_splits = 0;         // the attention plan's KV splits
  // MLA: the latent kernel alone (MlaLatentAttention); attention_us is then the whole absorbed
  // attention (+ the W_UK / W_UV GEMMs, which DCP does not divide).
  double latent_us = -1;
};

// Runs this rank's part of config `c`. Every rank of `comm` (null iff c.dcp == 1; its size must
// be c.dcp and its rank c.rank) calls it with the same config apart from `rank`: the
// collectives are matched by order. `num_sms`: the device's multiprocessor count.
absl::StatusOr<LayerTimes> RunLayer(const LayerConfig& c, comm::DeviceCommunicator* comm,
                                    int num_sms);

}  // namespace tandem::runtime::dcp_bench

#endif  // TANDEM_RUNTIME_PARALLEL_DCP_BENCH_DCP_BENCH_LAYER_H_
