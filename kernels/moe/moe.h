// Mixture-of-experts layer on the CPU backend (and the reference the CUDA kernels will mirror):
// router scores -> softmax top-k -> tokens permuted by expert -> each expert's SwiGLU MLP on its
// rows -> weighted combine back into token order; plus the sigmoid-gated shared expert of
// Qwen2-MoE. Routing travels as one value (MoeRouting) from the router to the experts.
//
// Shapes (T tokens, H hidden, E experts, k = top_k, I = one expert's intermediate width):
//   router_logits [T, E]; x, out [T, H]; gate_up [E, 2*I, H] (per expert: gate rows, then up
//   rows, nn.Linear layout); down [E, H, I].
// Under tensor parallelism each rank passes its slice of every expert (I = Ie / N) and the same
// routing; the partial outputs sum (all-reduce) to the whole layer's, since the combine is linear.
//
// Thread safety: functions are reentrant; a MoeScratch belongs to one caller at a time.
#ifndef TANDEM_KERNELS_MOE_MOE_H_
#define TANDEM_KERNELS_MOE_MOE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/fp8/fp8_linear.h"
#include "kernels/threading/thread_pool.h"

namespace tandem::kernels {

struct MoeRoutingParams {
  int64_t num_experts = 0;
  int64_t top_k = 0;
  bool renormalize = false;  // divide the k probabilities by their sum (Mixtral, norm_topk_prob)
};

// The router's decision for a batch: token t goes to experts expert_ids[t*k + j] with weights
// weights[t*k + j], j = 0..k-1 in decreasing probability.
struct MoeRouting {
  int64_t num_tokens = 0;
  int64_t top_k = 0;
  std::vector<int32_t> expert_ids;  // [T, k]
  std::vector<float> weights;       // [T, k]
};

// Rows of the routing grouped by expert (counting sort, stable in token order): rows
// [offsets[e], offsets[e+1]) of the permuted batch go to expert e; row r holds token
// token_of_row[r] scaled by weight_of_row[r] when combined.
struct MoePermutation {
  std::vector<int64_t> expert_offsets;  // [E + 1]
  std::vector<int32_t> token_of_row;    // [T * k]
  std::vector<float> weight_of_row;     // [T * k]
};

// Non-owning view of one layer's experts (or of a rank's slice of each): fp32, or FP8 (e4m3
// codes of DeepSeek-V3's block-scaled experts, kernels/fp8) when gate_up_fp8.codes is set.
// The FP8 views stack the experts as the fp32 ones do (gate_up_fp8.grid [E * 2*I, H],
// down_fp8.grid [E * H, I]) with per-row scales (grid.block_rows == 1), so expert e is rows
// [e * 2*I, (e+1) * 2*I) / [e * H, (e+1) * H) of its view.
struct MoeExpertWeights {
  const float* gate_up = nullptr;  // [E, 2*I, H]
  const float* down = nullptr;     // [E, H, I]
  int64_t num_experts = 0;
  int64_t hidden = 0;
  int64_t intermediate = 0;        // I
  Fp8WeightView gate_up_fp8 = {};  // codes null: fp32 experts
  Fp8WeightView down_fp8 = {};
  bool IsFp8() const { return gate_up_fp8.codes != nullptr; }
};

// Reused buffers of FusedMoe (grown on demand).
struct MoeScratch {
  MoePermutation permutation;
  std::vector<float> rows, gate_up, act, expert_out;
};

// DeepSeek's router (transformers' DeepseekV2Moe / DeepseekV3MoE.route_tokens_to_experts), every
// variant in one function (routing.cc):
//   scores  = softmax (V2: `greedy`, `group_limited_greedy`) or sigmoid (V3: `noaux_tc`) of the
//             logits, in fp32;
//   choice  = scores + correction_bias (V3's e_score_correction_bias; used to choose only);
//   groups  = with num_groups > 1, the experts split into num_groups contiguous groups scored by
//             their max choice (V2) or the sum of their two largest (V3); the topk_groups best
//             groups kept, the other experts' choice set to -inf (sigmoid, V3) or 0 (softmax,
//             V2), as transformers 5.17's masked_fill;
//   experts = the top_k largest choices (ties: the lower id);
//   weights = the chosen experts' scores (V3: unbiased, unmasked; V2: the masked choice),
//             divided by their sum (+1e-20 for sigmoid, as V3) when renormalize (V3's
//             norm_topk_prob; V2 ignores it), times routed_scaling_factor.
// INVALID_ARGUMENT naming the numbers unless 1 <= top_k <= E, num_groups divides E,
// 1 <= topk_groups <= num_groups, and a two-largest group score has >= 2 experts per group.
enum class MoeScoring { kSoftmax, kSigmoid };
enum class MoeGroupScore { kMax, kTopTwoSum };
struct GroupedRoutingParams {
  int64_t num_experts = 0;
  int64_t top_k = 0;
  MoeScoring scoring = MoeScoring::kSoftmax;
  int64_t num_groups = 1;
  int64_t topk_groups = 1;
  MoeGroupScore group_score = MoeGroupScore::kMax;
  const float* correction_bias = nullptr;  // [E] or null
  bool renormalize = false;
  float routed_scaling_factor = 1.0f;
};
namespace cpu {

// softmax(router_logits[t]) in fp32 (max subtracted), the k largest probabilities (ties: the
// lower expert id first), renormalised to sum 1 when params.renormalize — transformers'
// MixtralSparseMoeBlock / Qwen*MoeSparseMoeBlock. INVALID_ARGUMENT unless 1 <= k <= E.
absl::Status SoftmaxTopK(const float* router_logits, int64_t num_tokens,
                         const MoeRoutingParams& params, MoeRouting* routing);

// DeepSeek's routing: see GroupedRoutingParams.
absl::Status GroupedTopK(const float* router_logits, int64_t num_tokens,
                         const GroupedRoutingParams& params, MoeRouting* routing);

// Groups `routing`'s rows by expert. INVALID_ARGUMENT for an expert id outside [0, num_experts).
absl::Status PermuteByExpert(const MoeRouting& routing, int64_t num_experts,
                             MoePermutation* permutation);

// out[t] = sum_j weights[t,j] * down_e(silu(gate_e x[t]) * up_e x[t]), e = expert_ids[t,j]:
// gathers each expert's tokens, runs its two GEMMs on them only (experts with no token are not
// read), and scatters back with the weights. `out` ([T, H]) is overwritten, may not alias `x`.
// FP8 experts (experts.IsFp8()) run each GEMM as Fp8Linear (the rows' activations quantized as
// the view's scheme says, per token or per 1x128 group, so the result does not depend on how
// tokens are grouped); INVALID_ARGUMENT when the views' grids are not the stacked shapes above.
absl::Status FusedMoe(const float* x, const MoeRouting& routing, const MoeExpertWeights& experts,
                      float* out, ThreadPool* pool, MoeScratch* scratch);

// out[t] += sigmoid(gate_weight . x[t]) * shared[t] for t < T (Qwen2-MoE's shared expert,
// `shared` = its MLP output): x, shared, out [T, H]; gate_weight [H].
void AddSigmoidGated(const float* x, const float* gate_weight, const float* shared,
                     int64_t num_tokens, int64_t hidden, float* out);

}  // namespace cpu
}  // namespace tandem::kernels

#endif  // TANDEM_KERNELS_MOE_MOE_H_
