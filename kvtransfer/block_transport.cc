#include "kvtransfer/block_transport.h"

#include <vector>

#include "kvtransfer/copy_ops.h"

namespace tandem::kvtransfer {

std::vector<ByteRange> BlocksToByteRanges(absl::Span<const int32_t> block_ids,
                                          uint64_t block_bytes) {
  std::vector<ByteRange> ranges;
  for (int32_t b : block_ids) {
    const uint64_t offset = static_cast<uint64_t>(b) * block_bytes;
    if (!ranges.empty() && ranges.back().offset + ranges.back().length == offset) {
      ranges.back().length += block_bytes;
    } else {
      ranges.push_back({offset, block_bytes});
    }
  }
  return ranges;
}

std::vector<CopyOp> BlockPairsToCopyOps(absl::Span<const std::pair<int32_t, int32_t>> blocks,
                                        uint32_t local_region, uint32_t remote_region,
                                        uint64_t block_bytes) {
  std::vector<uint32_t> local, remote;
  local.reserve(blocks.size());
  remote.reserve(blocks.size());
  for (const auto& [source, destination] : blocks) {
    remote.push_back(static_cast<uint32_t>(source));
    local.push_back(static_cast<uint32_t>(destination));
  }
  return BlockCopyOps(local_region, remote_region, block_bytes, local, remote);
}

}  // namespace tandem::kvtransfer
