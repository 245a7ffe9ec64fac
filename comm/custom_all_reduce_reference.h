// The custom all-reduce on the host (CI has no GPU): the kernels' phases played rank by rank and
// block by block with the pack assignment of custom_all_reduce_layout.h, on bf16 values summed
// the way the kernels sum them. Checks what the per-block flag barriers rely on: every pack a
// block reads from a peer's buffer was written there by the same block index of that peer in an
// earlier phase of the same call, and every output pack is written exactly once.
//
// Thread-safe (no state).
#ifndef TANDEM_COMM_CUSTOM_ALL_REDUCE_REFERENCE_H_
#define TANDEM_COMM_CUSTOM_ALL_REDUCE_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/custom_all_reduce_layout.h"

namespace tandem::comm {

// Each rank's output of `launch` (one-shot or two-shot) over `inputs` (one bf16 vector per rank,
// launch.packs * 8 values each). FAILED_PRECONDITION naming the rank, block and pack when the
// assignment breaks the barrier discipline or leaves an output pack unwritten / written twice;
// INVALID_ARGUMENT for inputs that do not match the launch.
absl::StatusOr<std::vector<std::vector<uint16_t>>> SimulateAllReduceBf16(
    const std::vector<std::vector<uint16_t>>& inputs, const ArLaunch& launch);

// The sum every rank must get: fp32 accumulation in rank order 0..N-1, rounded to bf16 once.
std::vector<uint16_t> AllReduceReferenceBf16(const std::vector<std::vector<uint16_t>>& inputs);

// The fused all-reduce + add + RMSNorm (AddRmsNormArgs) on bf16 rows of `hidden` values.
struct AddRmsNormBf16 {
  std::vector<uint16_t> residual;  // [rows, hidden]: after the add
  std::vector<uint16_t> out;       // [rows, hidden]: the normalized rows
};

// What every rank must get: the all-reduce's sum (AllReduceAddRmsNorm's first step,
// AllReduceReferenceBf16), then per row the kernels' arithmetic: residual = bf16(residual + sum)
// (or the sum), the mean of squares in fp32, out = bf16((residual / sqrt(mean + eps)) * weight).
// The kernels scale by rsqrtf (approximate to 2 ulp in fp32), so theirs may differ in the last
// bf16 bit of a few outputs; the residual is exact.
AddRmsNormBf16 AllReduceAddRmsNormReferenceBf16(const std::vector<std::vector<uint16_t>>& inputs,
                                                const std::vector<uint16_t>& residual,
                                                const std::vector<uint16_t>& weight, int64_t hidden,
                                                float eps, bool add_residual);

// The fused kernel played on the host with its pack assignment (PlanAllReduceNorm, ArNormPack):
// block b of every rank copies its packs of its group's rows into its staging buffer, meets its
// peers, then the group's blocks sum those packs over every staging buffer and each row is
// normalized. Each rank's result; FAILED_PRECONDITION when a block reads a pack another block
// wrote or a pack is written twice / never (as SimulateAllReduceBf16); INVALID_ARGUMENT for
// inputs that do not match the launch.
absl::StatusOr<std::vector<AddRmsNormBf16>> SimulateAllReduceAddRmsNormBf16(
    const std::vector<std::vector<uint16_t>>& inputs, const std::vector<uint16_t>& residual,
    const std::vector<uint16_t>& weight, const ArNormLaunch& launch, int64_t hidden, float eps,
    bool add_residual);

}  // namespace tandem::comm

#endif  // TANDEM_COMM_CUSTOM_ALL_REDUCE_REFERENCE_H_
