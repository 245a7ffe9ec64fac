#include "kernels/moe/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/gemm/linear.h"
#include "kernels/layers/activation.h"

namespace tandem::kernels::cpu {

absl::Status SoftmaxTopK(const float* router_logits, int64_t num_tokens,
                         const MoeRoutingParams& params, MoeRouting* routing) {
  const int64_t e_count = params.num_experts, k = params.top_k;
  if (e_count < 1 || k < 1 || k > e_count || num_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("moe routing: top_k ", k, " must be in [1, ",
                                                   e_count, "] (the number of experts), tokens ",
                                                   num_tokens));
  }
  routing->num_tokens = num_tokens;
  routing->top_k = k;
  routing->expert_ids.resize(num_tokens * k);
  routing->weights.resize(num_tokens * k);
  std::vector<float> prob(e_count);
  std::vector<int32_t> order(e_count);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* logits = router_logits + t * e_count;
    const float max = *std::max_element(logits, logits + e_count);
    float sum = 0.0f;
    for (int64_t e = 0; e < e_count; ++e) {
      prob[e] = std::exp(logits[e] - max);
      sum += prob[e];
    }
    for (int64_t e = 0; e < e_count; ++e) prob[e] /= sum;
    std::iota(order.begin(), order.end(), 0);
    // Larger probability first; equal ones by id, so the choice is deterministic.
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return prob[a] > prob[b] || (prob[a] == prob[b] && a < b);
    });
    float chosen = 0.0f;
    for (int64_t j = 0; j < k; ++j) chosen += prob[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      routing->expert_ids[t * k + j] = order[j];
      routing->weights[t * k + j] = params.renormalize ? prob[order[j]] / chosen : prob[order[j]];
    }
  }
  return absl::OkStatus();
}

absl::Status PermuteByExpert(const MoeRouting& routing, int64_t num_experts,
                             MoePermutation* permutation) {
  const int64_t rows = routing.num_tokens * routing.top_k;
  if (static_cast<int64_t>(routing.expert_ids.size()) != rows ||
      static_cast<int64_t>(routing.weights.size()) != rows) {
    return absl::InvalidArgumentError("moe permutation: routing sizes disagree with T * k");
  }
  std::vector<int64_t>& offsets = permutation->expert_offsets;
  offsets.assign(num_experts + 1, 0);
  for (int32_t e : routing.expert_ids) {
    if (e < 0 || e >= num_experts) {
      return absl::InvalidArgumentError(
          absl::StrCat("moe permutation: expert id ", e, " not in [0, ", num_experts, ")"));
    }
    ++offsets[e + 1];
  }
  for (int64_t e = 0; e < num_experts; ++e) offsets[e + 1] += offsets[e];
  std::vector<int64_t> next(offsets.begin(), offsets.end() - 1);
  permutation->token_of_row.resize(rows);
  permutation->weight_of_row.resize(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t slot = next[routing.expert_ids[r]]++;
    permutation->token_of_row[slot] = static_cast<int32_t>(r / routing.top_k);
    permutation->weight_of_row[slot] = routing.weights[r];
  }
  return absl::OkStatus();
}

namespace {

// Rows [first, first + count) of a stacked FP8 view with per-row scales.
Fp8WeightView RowsOf(const Fp8WeightView& all, int64_t first, int64_t count) {
  Fp8WeightView v = all;
  v.codes = all.codes + first * all.grid.cols;
  v.scales = all.scales + first * all.grid.GridCols();
  v.grid.rows = count;
  return v;
}

absl::Status CheckExperts(const MoeExpertWeights& w) {
  const int64_t E = w.num_experts, H = w.hidden, I = w.intermediate;
  if (H < 1 || I < 1) return absl::InvalidArgumentError("moe: expert weights missing or empty");
  if (!w.IsFp8()) {
    if (w.gate_up == nullptr || w.down == nullptr) {
      return absl::InvalidArgumentError("moe: expert weights missing or empty");
    }
    return absl::OkStatus();
  }
  const Fp8ScaleGrid& gu = w.gate_up_fp8.grid;
  const Fp8ScaleGrid& dn = w.down_fp8.grid;
  if (w.down_fp8.codes == nullptr || gu.rows != E * 2 * I || gu.cols != H || gu.block_rows != 1 ||
      dn.rows != E * H || dn.cols != I || dn.block_rows != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "moe: FP8 experts are [", gu.rows, ", ", gu.cols, "] / [", dn.rows, ", ", dn.cols,
        "] with row blocks ", gu.block_rows, " / ", dn.block_rows, ", expected [", E * 2 * I, ", ",
        H, "] / [", E * H, ", ", I, "] with per-row scales"));
  }
  RETURN_IF_ERROR(ValidateFp8Weight(w.gate_up_fp8));
  return ValidateFp8Weight(w.down_fp8);
}

}  // namespace

absl::Status FusedMoe(const float* x, const MoeRouting& routing, const MoeExpertWeights& w,
                      float* out, ThreadPool* pool, MoeScratch* scratch) {
  const int64_t T = routing.num_tokens, H = w.hidden, I = w.intermediate;
  RETURN_IF_ERROR(CheckExperts(w));
  MoePermutation& perm = scratch->permutation;
  absl::Status status = PermuteByExpert(routing, w.num_experts, &perm);
  if (!status.ok()) return status;
  const int64_t rows = T * routing.top_k;
  // Gather: the permuted batch, each expert's tokens contiguous.
  scratch->rows.resize(rows * H);
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(x + static_cast<int64_t>(perm.token_of_row[r]) * H, H,
                scratch->rows.data() + r * H);
  }
  scratch->gate_up.resize(rows * 2 * I);
  scratch->act.resize(rows * I);
  scratch->expert_out.resize(rows * H);
  for (int64_t e = 0; e < w.num_experts; ++e) {
    const int64_t begin = perm.expert_offsets[e], m = perm.expert_offsets[e + 1] - begin;
    if (m == 0) continue;  // an expert without tokens is never read
    float* gate_up = scratch->gate_up.data() + begin * 2 * I;
    float* act = scratch->act.data() + begin * I;
    const float* rows_in = scratch->rows.data() + begin * H;
    float* rows_out = scratch->expert_out.data() + begin * H;
    if (w.IsFp8()) {
      RETURN_IF_ERROR(
          Fp8Linear(rows_in, RowsOf(w.gate_up_fp8, e * 2 * I, 2 * I), nullptr, m, gate_up, pool));
      SiluAndMul(gate_up, m, I, act);
      RETURN_IF_ERROR(Fp8Linear(act, RowsOf(w.down_fp8, e * H, H), nullptr, m, rows_out, pool));
      continue;
    }
    Linear(rows_in, w.gate_up + e * 2 * I * H, nullptr, m, 2 * I, H, gate_up, pool);
    SiluAndMul(gate_up, m, I, act);
    Linear(act, w.down + e * H * I, nullptr, m, H, I, rows_out, pool);
  }
  // Combine: out[t] = sum of its rows' outputs times their weights, in the routing's order
  // within a token (the permutation is stable in token order, not in j).
  std::fill_n(out, T * H, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    float* dst = out + static_cast<int64_t>(perm.token_of_row[r]) * H;
    const float* src = scratch->expert_out.data() + r * H;
    const float weight = perm.weight_of_row[r];
    for (int64_t h = 0; h < H; ++h) dst[h] += weight * src[h];
  }
  return absl::OkStatus();
}

void AddSigmoidGated(const float* x, const float* gate_weight, const float* shared,
                     int64_t num_tokens, int64_t hidden, float* out) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    float dot = 0.0f;
    for (int64_t h = 0; h < hidden; ++h) dot += gate_weight[h] * x[t * hidden + h];
    const float gate = 1.0f / (1.0f + std::exp(-dot));
    for (int64_t h = 0; h < hidden; ++h) out[t * hidden + h] += gate * shared[t * hidden + h];
  }
}

}  // namespace tandem::kernels::cpu
