#include "kvtransfer/copy_ops.h"

#include "absl/strings/str_cat.h"

namespace tandem::kvtransfer {
namespace {

// Range [offset, offset + length) inside a region of `region_bytes`, without overflow.
bool InRange(uint64_t offset, uint64_t length, uint64_t region_bytes) {
  return offset <= region_bytes && length <= region_bytes - offset;
}

absl::Status CheckSide(size_t i, const char* side, uint32_t region, uint64_t offset,
                       uint64_t length, absl::Span<const uint64_t> region_bytes) {
  if (region >= region_bytes.size()) {
    return absl::OutOfRangeError(absl::StrCat("copy op ", i, ": ", side, " region ", region,
                                              " not registered (", region_bytes.size(),
                                              " regions)"));
  }
  if (!InRange(offset, length, region_bytes[region])) {
    return absl::OutOfRangeError(absl::StrCat("copy op ", i, ": ", side, " range [", offset, ", +",
                                              length, ") outside region ", region, " of ",
                                              region_bytes[region], " bytes"));
  }
  return absl::OkStatus();
}

// Bytes spanned by `rows` rows of `row_bytes` at `stride` (the last row's end), or false on
// overflow.
bool Span(uint64_t rows, uint64_t stride, uint64_t row_bytes, uint64_t* span) {
  const uint64_t before_last = rows - 1;
  if (stride != 0 && before_last > (UINT64_MAX - row_bytes) / stride) return false;
  *span = before_last * stride + row_bytes;
  return true;
}

}  // namespace

absl::Status ValidateCopyOps(absl::Span<const CopyOp> ops,
                             absl::Span<const uint64_t> local_region_bytes,
                             absl::Span<const uint64_t> remote_region_bytes) {
  if (ops.empty()) return absl::InvalidArgumentError("empty copy batch");
  for (size_t i = 0; i < ops.size(); ++i) {
    const CopyOp& op = ops[i];
    if (op.length == 0) {
      return absl::InvalidArgumentError(absl::StrCat("copy op ", i, " has length 0"));
    }
    if (absl::Status s =
            CheckSide(i, "local", op.local_region, op.local_offset, op.length, local_region_bytes);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckSide(i, "remote", op.remote_region, op.remote_offset, op.length,
                                   remote_region_bytes);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

std::vector<CopyOp> CoalesceCopyOps(absl::Span<const CopyOp> ops) {
  std::vector<CopyOp> out;
  out.reserve(ops.size());
  for (const CopyOp& op : ops) {
    if (!out.empty()) {
      CopyOp& last = out.back();
      if (last.local_region == op.local_region && last.remote_region == op.remote_region &&
          last.local_offset + last.length == op.local_offset &&
          last.remote_offset + last.length == op.remote_offset) {
        last.length += op.length;
        continue;
      }
    }
    out.push_back(op);
  }
  return out;
}

std::vector<CopyOp> BlockCopyOps(uint32_t local_region, uint32_t remote_region,
                                 uint64_t block_bytes, absl::Span<const uint32_t> local_blocks,
                                 absl::Span<const uint32_t> remote_blocks) {
  if (local_blocks.size() != remote_blocks.size()) return {};
  std::vector<CopyOp> ops;
  ops.reserve(local_blocks.size());
  for (size_t i = 0; i < local_blocks.size(); ++i) {
    ops.push_back(CopyOp{.local_region = local_region,
                         .local_offset = uint64_t{local_blocks[i]} * block_bytes,
                         .remote_region = remote_region,
                         .remote_offset = uint64_t{remote_blocks[i]} * block_bytes,
                         .length = block_bytes});
  }
  return CoalesceCopyOps(ops);
}

uint64_t TotalBytes(absl::Span<const CopyOp> ops) {
  uint64_t total = 0;
  for (const CopyOp& op : ops) total += op.length;
  return total;
}

absl::Status ValidateStridedCopyOps(absl::Span<const StridedCopyOp> ops,
                                    absl::Span<const uint64_t> local_region_bytes,
                                    absl::Span<const uint64_t> remote_region_bytes) {
  if (ops.empty()) return absl::InvalidArgumentError("empty copy batch");
  for (size_t i = 0; i < ops.size(); ++i) {
    const StridedCopyOp& op = ops[i];
    if (op.rows == 0 || op.row_bytes == 0) {
      return absl::InvalidArgumentError(absl::StrCat("strided copy op ", i, " has ", op.rows,
                                                     " rows of ", op.row_bytes, " bytes"));
    }
    if ((op.rows > 1 && op.local_stride < op.row_bytes) ||
        (op.rows > 1 && op.remote_stride < op.row_bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "strided copy op ", i, ": strides ", op.local_stride, " (local) and ", op.remote_stride,
          " (remote) must be at least the row of ", op.row_bytes, " bytes"));
    }
    uint64_t local_span = 0, remote_span = 0;
    if (!Span(op.rows, op.local_stride, op.row_bytes, &local_span) ||
        !Span(op.rows, op.remote_stride, op.row_bytes, &remote_span)) {
      return absl::OutOfRangeError(
          absl::StrCat("strided copy op ", i, ": ", op.rows, " rows overflow the address space"));
    }
    if (absl::Status s =
            CheckSide(i, "local", op.local_region, op.local_offset, local_span, local_region_bytes);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckSide(i, "remote", op.remote_region, op.remote_offset, remote_span,
                                   remote_region_bytes);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

std::vector<StridedCopyOp> CoalesceStridedCopyOps(absl::Span<const StridedCopyOp> ops) {
  std::vector<StridedCopyOp> out;
  out.reserve(ops.size());
  for (const StridedCopyOp& op : ops) {
    if (!out.empty()) {
      StridedCopyOp& last = out.back();
      if (last.local_region == op.local_region && last.remote_region == op.remote_region &&
          last.row_bytes == op.row_bytes && last.local_stride == op.local_stride &&
          last.remote_stride == op.remote_stride && op.rows > 0 &&
          last.local_offset + last.rows * last.local_stride == op.local_offset &&
          last.remote_offset + last.rows * last.remote_stride == op.remote_offset) {
        last.rows += op.rows;
        continue;
      }
    }
    out.push_back(op);
  }
  return out;
}

uint64_t TotalBytes(absl::Span<const StridedCopyOp> ops) {
  uint64_t total = 0;
  for (const StridedCopyOp& op : ops) total += op.rows * op.row_bytes;
  return total;
}

StridedCopyOp AsStrided(const CopyOp& op) {
  return StridedCopyOp{.local_region = op.local_region,
                       .local_offset = op.local_offset,
                       .local_stride = op.length,
                       .remote_region = op.remote_region,
                       .remote_offset = op.remote_offset,
                       .remote_stride = op.length,
                       .row_bytes = op.length,
                       .rows = 1};
}

}  // namespace tandem::kvtransfer
