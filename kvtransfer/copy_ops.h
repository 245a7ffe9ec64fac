// CopyOp helpers shared by every TransferAgent backend: validation against region sizes,
// coalescing of contiguous runs, and block lists -> CopyOps for the block-major KV pool
// (one block = one contiguous byte range of `block_bytes`).
//
// Thread safety: all functions are pure (no shared state).
#ifndef TANDEM_KVTRANSFER_COPY_OPS_H_
#define TANDEM_KVTRANSFER_COPY_OPS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kvtransfer/transfer_agent.h"

namespace tandem::kvtransfer {

// Checks a PostRead batch: INVALID_ARGUMENT for an empty batch or a zero-length op;
// OUT_OF_RANGE for an unknown region index or a range past a region's end (overflow-safe).
// `local_region_bytes[i]` / `remote_region_bytes[i]` are the lengths of region i.
absl::Status ValidateCopyOps(absl::Span<const CopyOp> ops,
                             absl::Span<const uint64_t> local_region_bytes,
                             absl::Span<const uint64_t> remote_region_bytes);

// Merges op i+1 into op i when both its local and remote ranges continue op i's exactly (same
// regions, adjacent offsets). Keeps the order; the result moves the same bytes to the same places.
std::vector<CopyOp> CoalesceCopyOps(absl::Span<const CopyOp> ops);

// One op per block pair: remote block `remote_blocks[i]` -> local block `local_blocks[i]`, each
// `block_bytes` long (block b starts at byte b * block_bytes of its region), then coalesced.
// REQUIRES: local_blocks.size() == remote_blocks.size() (otherwise returns an empty vector).
std::vector<CopyOp> BlockCopyOps(uint32_t local_region, uint32_t remote_region,
                                 uint64_t block_bytes, absl::Span<const uint32_t> local_blocks,
                                 absl::Span<const uint32_t> remote_blocks);

// Sum of the ops' lengths.
uint64_t TotalBytes(absl::Span<const CopyOp> ops);

// Strided batches (StridedCopyOp), the same checks: INVALID_ARGUMENT for an empty batch, zero
// rows or row bytes, a stride below the row length; OUT_OF_RANGE for an unknown region or a last
// row past a region's end (overflow-safe).
absl::Status ValidateStridedCopyOps(absl::Span<const StridedCopyOp> ops,
                                    absl::Span<const uint64_t> local_region_bytes,
                                    absl::Span<const uint64_t> remote_region_bytes);

// Merges op i+1 into op i when it continues op i's rows exactly (same regions, row length and
// strides; its first rows are where op i's next rows would be on both sides).
std::vector<StridedCopyOp> CoalesceStridedCopyOps(absl::Span<const StridedCopyOp> ops);

// rows * row_bytes summed over the ops.
uint64_t TotalBytes(absl::Span<const StridedCopyOp> ops);

// A contiguous op as a strided one of one row.
StridedCopyOp AsStrided(const CopyOp& op);

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_COPY_OPS_H_
