#include "comm/custom_all_reduce_reference.h"

#include <cmath>
#include <functional>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem::comm {
namespace {

constexpr int64_t kPackValues = kArPackBytes / 2;  // bf16 values per pack

// One rank's IPC buffer as the simulation sees it: values and, per pack, the block that wrote it
// in this call (-1: not yet).
struct SimBuffer {
  std::vector<uint16_t> values;
  std::vector<int> writer;
  explicit SimBuffer(int64_t packs) : values(packs * kPackValues, 0), writer(packs, -1) {}
};

// Calls fn(b, index) for every index block b's threads handle among n, in the kernels' order.
void ForEachIndex(const ArLaunch& launch, int64_t n, const std::function<void(int, int64_t)>& fn) {
  for (int b = 0; b < launch.blocks; ++b) {
    for (int t = 0; t < kArThreads; ++t) {
      for (int64_t k = 0;; ++k) {
        const int64_t i = ArIndex(launch, b, t, k, n);
        if (i < 0) break;
        fn(b, i);
      }
    }
  }
}

absl::Status ReadCheck(const SimBuffer& buffer, int owner, int reader, int b, int64_t pack,
                       const char* phase) {
  if (buffer.writer[pack] == b) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      phase, ": rank ", reader, " block ", b, " reads pack ", pack, " of rank ", owner,
      ", written by block ", buffer.writer[pack], " (the barrier only orders block ", b, ")"));
}

// The fp32 sum in rank order of pack `pack` over `buffers`, rounded: what a kernel writes.
void SumPack(const std::vector<SimBuffer>& buffers, int64_t pack, uint16_t* out) {
  for (int64_t e = 0; e < kPackValues; ++e) {
    float acc = 0.0f;
    for (const SimBuffer& buffer : buffers)
      acc += ArBf16ToFloat(buffer.values[pack * kPackValues + e]);
    out[e] = ArFloatToBf16(acc);
  }
}

// Row `row` of the fused op from its summed values `sum` (bf16, `hidden` of them): the add, then
// the norm, into result's row.
void AddNormRow(const uint16_t* sum, const std::vector<uint16_t>& residual,
                const std::vector<uint16_t>& weight, int64_t row, int64_t hidden, float eps,
                bool add_residual, AddRmsNormBf16* result) {
  uint16_t* res = &result->residual[row * hidden];
  float sum_sq = 0.0f;
  for (int64_t i = 0; i < hidden; ++i) {
    res[i] = add_residual
                 ? ArFloatToBf16(ArBf16ToFloat(residual[row * hidden + i]) + ArBf16ToFloat(sum[i]))
                 : sum[i];
    const float r = ArBf16ToFloat(res[i]);
    sum_sq += r * r;
  }
  const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(hidden) + eps);
  for (int64_t i = 0; i < hidden; ++i) {
    result->out[row * hidden + i] =
        ArFloatToBf16((ArBf16ToFloat(res[i]) * inv_rms) * ArBf16ToFloat(weight[i]));
  }
}

}  // namespace

AddRmsNormBf16 AllReduceAddRmsNormReferenceBf16(const std::vector<std::vector<uint16_t>>& inputs,
                                                const std::vector<uint16_t>& residual,
                                                const std::vector<uint16_t>& weight, int64_t hidden,
                                                float eps, bool add_residual) {
  const std::vector<uint16_t> sum = AllReduceReferenceBf16(inputs);
  AddRmsNormBf16 result{std::vector<uint16_t>(sum.size()), std::vector<uint16_t>(sum.size())};
  for (int64_t row = 0; row * hidden < static_cast<int64_t>(sum.size()); ++row) {
    AddNormRow(&sum[row * hidden], residual, weight, row, hidden, eps, add_residual, &result);
  }
  return result;
}

absl::StatusOr<std::vector<AddRmsNormBf16>> SimulateAllReduceAddRmsNormBf16(
    const std::vector<std::vector<uint16_t>>& inputs, const std::vector<uint16_t>& residual,
    const std::vector<uint16_t>& weight, const ArNormLaunch& launch, int64_t hidden, float eps,
    bool add_residual) {
  const int world = static_cast<int>(inputs.size());
  const int64_t values = launch.rows * hidden;
  if (!launch.fused || world < 1 || launch.blocks != launch.groups * launch.row_blocks ||
      launch.groups < 1 || launch.row_blocks * launch.threads != kArNormThreads ||
      launch.row_packs * kPackValues != hidden || static_cast<int64_t>(residual.size()) != values ||
      static_cast<int64_t>(weight.size()) != hidden) {
    return absl::InvalidArgumentError("not a fused launch of these shapes");
  }
  for (const std::vector<uint16_t>& in : inputs) {
    if (static_cast<int64_t>(in.size()) != values) {
      return absl::InvalidArgumentError(absl::StrCat("input of ", in.size(), " values"));
    }
  }
  const int64_t packs = launch.rows * launch.row_packs;
  std::vector<SimBuffer> staging(world, SimBuffer(packs));
  // Calls fn(b, pack in the row) for every pack block b's logical threads hold in a row of its
  // group, in the kernel's order (ArNormPack).
  auto for_each_pack = [&](int b, const std::function<void(int64_t)>& fn) {
    for (int t = 0; t < launch.threads; ++t) {
      for (int v = 0; v < launch.vecs; ++v) {
        if (const int64_t j = ArNormPack(launch, b, t, v); j >= 0) fn(j);
      }
    }
  };
  // Phase 1: block b copies its packs of its group's rows into the staging buffer.
  for (int r = 0; r < world; ++r) {
    for (int b = 0; b < launch.blocks; ++b) {
      for (int64_t row = b / launch.row_blocks; row < launch.rows; row += launch.groups) {
        for_each_pack(b, [&](int64_t j) {
          const int64_t p = row * launch.row_packs + j;
          std::copy_n(&inputs[r][p * kPackValues], kPackValues,
                      &staging[r].values[p * kPackValues]);
          staging[r].writer[p] = b;
        });
      }
    }
  }
  // Phase 2 (after the barrier): each group's blocks sum their packs of its rows over every
  // staging buffer; the row is normalized once all its packs are summed.
  std::vector<AddRmsNormBf16> results(
      world, AddRmsNormBf16{std::vector<uint16_t>(values), std::vector<uint16_t>(values)});
  for (int r = 0; r < world; ++r) {
    std::vector<int> pack_writes(packs, 0);
    std::vector<uint16_t> sum(hidden);
    for (int g = 0; g < launch.groups; ++g) {
      for (int64_t row = g; row < launch.rows; row += launch.groups) {
        for (int b = g * launch.row_blocks; b < (g + 1) * launch.row_blocks; ++b) {
          absl::Status status;
          for_each_pack(b, [&](int64_t j) {
            const int64_t p = row * launch.row_packs + j;
            for (int q = 0; q < world && status.ok(); ++q) {
              status = ReadCheck(staging[q], q, r, b, p, "norm");
            }
            SumPack(staging, p, &sum[j * kPackValues]);
            ++pack_writes[p];
          });
          RETURN_IF_ERROR(status);
        }
        AddNormRow(sum.data(), residual, weight, row, hidden, eps, add_residual, &results[r]);
      }
    }
    for (int64_t p = 0; p < packs; ++p) {
      if (pack_writes[p] != 1) {
        return absl::FailedPreconditionError(absl::StrCat("rank ", r, " row ", p / launch.row_packs,
                                                          " pack ", p % launch.row_packs,
                                                          " written ", pack_writes[p], " times"));
      }
    }
  }
  return results;
}

std::vector<uint16_t> AllReduceReferenceBf16(const std::vector<std::vector<uint16_t>>& inputs) {
  std::vector<uint16_t> out(inputs.empty() ? 0 : inputs[0].size());
  for (size_t i = 0; i < out.size(); ++i) {
    float acc = 0.0f;
    for (const std::vector<uint16_t>& in : inputs) acc += ArBf16ToFloat(in[i]);
    out[i] = ArFloatToBf16(acc);
  }
  return out;
}

absl::StatusOr<std::vector<std::vector<uint16_t>>> SimulateAllReduceBf16(
    const std::vector<std::vector<uint16_t>>& inputs, const ArLaunch& launch) {
  const int world = static_cast<int>(inputs.size());
  if (launch.path == ArPath::kNccl || world < 1 || launch.blocks < 1) {
    return absl::InvalidArgumentError("not a custom all-reduce launch");
  }
  for (const std::vector<uint16_t>& in : inputs) {
    if (static_cast<int64_t>(in.size()) != launch.packs * kPackValues) {
      return absl::InvalidArgumentError(
          absl::StrCat("input of ", in.size(), " values, launch of ", launch.packs, " packs"));
    }
  }
  const bool two_shot = launch.path == ArPath::kTwoShot;
  const int64_t n = two_shot ? launch.segment : launch.packs;
  std::vector<SimBuffer> staging(world, SimBuffer(launch.packs));
  std::vector<SimBuffer> result(world, SimBuffer(launch.packs));
  std::vector<SimBuffer> out(world, SimBuffer(launch.packs));
  auto copy_in = [&](int r, int b, int64_t pack) {
    std::copy_n(&inputs[r][pack * kPackValues], kPackValues,
                &staging[r].values[pack * kPackValues]);
    staging[r].writer[pack] = b;
  };
  // Phase 1: every rank copies its input into its staging buffer.
  for (int r = 0; r < world; ++r) {
    ForEachIndex(launch, n, [&](int b, int64_t i) {
      if (!two_shot) return copy_in(r, b, i);
      for (int j = 0; j < world; ++j) {
        if (const int64_t p = ArSegmentPack(launch, j, i); p >= 0) copy_in(r, b, p);
      }
    });
  }
  // Phase 2 (after the first barrier): sums. One-shot: every pack; two-shot: the rank's segment,
  // kept in its result buffer for the peers.
  absl::Status status;
  for (int r = 0; r < world; ++r) {
    ForEachIndex(launch, n, [&](int b, int64_t i) {
      const int64_t p = two_shot ? ArSegmentPack(launch, r, i) : i;
      if (p < 0 || !status.ok()) return;
      for (int q = 0; q < world && status.ok(); ++q) {
        status = ReadCheck(staging[q], q, r, b, p, "reduce");
      }
      SumPack(staging, p, &out[r].values[p * kPackValues]);
      ++out[r].writer[p];  // counts writes from -1
      if (two_shot) {
        std::copy_n(&out[r].values[p * kPackValues], kPackValues,
                    &result[r].values[p * kPackValues]);
        result[r].writer[p] = b;
      }
    });
  }
  // Phase 3 (two-shot, after the second barrier): every other segment from its owner.
  for (int r = 0; two_shot && r < world; ++r) {
    ForEachIndex(launch, n, [&](int b, int64_t i) {
      for (int j = 0; j < world && status.ok(); ++j) {
        const int64_t p = ArSegmentPack(launch, j, i);
        if (j == r || p < 0) continue;
        status = ReadCheck(result[j], j, r, b, p, "gather");
        std::copy_n(&result[j].values[p * kPackValues], kPackValues,
                    &out[r].values[p * kPackValues]);
        ++out[r].writer[p];
      }
    });
  }
  if (!status.ok()) return status;
  std::vector<std::vector<uint16_t>> outputs(world);
  for (int r = 0; r < world; ++r) {
    for (int64_t p = 0; p < launch.packs; ++p) {
      if (out[r].writer[p] != 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "rank ", r, " output pack ", p, " written ", out[r].writer[p] + 1, " times"));
      }
    }
    outputs[r] = std::move(out[r].values);
  }
  return outputs;
}

}  // namespace tandem::comm
