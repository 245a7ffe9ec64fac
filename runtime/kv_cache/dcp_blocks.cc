#include "runtime/kv_cache/dcp_blocks.h"

#include "absl/strings/str_cat.h"

namespace tandem::runtime {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

absl::Status DcpBlockLayout::Validate() const {
  if (size < 1 || block_size < 1 || interleave < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("DCP layout needs dcp >= 1, block_size >= 1 and "
                     "dcp_interleave >= 1; got dcp=",
                     size, ", block_size=", block_size, ", dcp_interleave=", interleave));
  }
  if (size == 1) return absl::OkStatus();
  if (!kernels::DcpShardValid(Shard(0))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dcp=", size, " x --dcp_interleave=", interleave, " exceeds 2^30 tokens per cycle"));
  }
  if (interleave % block_size != 0 && block_size % interleave != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dcp_interleave=", interleave,
                     " is neither a multiple of nor a divisor of the block size ", block_size,
                     ": a block would hold tokens of two shards"));
  }
  return absl::OkStatus();
}

int64_t DcpBlockLayout::ShardOfBlock(int64_t i) const {
  if (size == 1) return 0;
  if (interleave % block_size == 0) return (i / (interleave / block_size)) % size;
  return i % size;
}

int64_t DcpBlockLayout::NumShardBlocks(int64_t num_tokens, int64_t shard) const {
  if (num_tokens <= 0) return 0;
  return CeilDiv(kernels::DcpLocalCount(num_tokens, Shard(shard)), block_size);
}

int64_t DcpBlockLayout::NumBlocks(int64_t num_tokens) const {
  if (num_tokens <= 0) return 0;
  if (WholeBlocks()) return CeilDiv(num_tokens, block_size);
  int64_t total = 0;
  for (int64_t k = 0; k < size; ++k) total += NumShardBlocks(num_tokens, k);
  return total;
}

}  // namespace tandem::runtime
