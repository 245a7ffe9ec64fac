#include "kernels/attention/dcp_exchange.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace tandem::kernels {

absl::Status DcpExchangeLayout::Validate() const {
  if (num_tokens < 0 || num_heads <= 0 || head_dim <= 0 || dcp_size < 1 ||
      num_heads % dcp_size != 0 || (elem_bytes != 2 && elem_bytes != 4)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DcpExchangeLayout: need num_tokens >= 0, num_heads > 0 a multiple of dcp_size >= 1, "
        "head_dim > 0, elem_bytes 2 or 4; got num_tokens=",
        num_tokens, " num_heads=", num_heads, " head_dim=", head_dim, " dcp_size=", dcp_size,
        " elem_bytes=", elem_bytes));
  }
  // Each factor is below 2^31 and their product below 2^62, so BufferBytes() cannot overflow.
  constexpr int64_t kMax = int64_t{1} << 31;
  const double bytes = static_cast<double>(num_tokens) * static_cast<double>(num_heads) *
                       static_cast<double>(head_dim + 1) * static_cast<double>(elem_bytes + 4);
  if (num_tokens >= kMax || num_heads >= kMax || head_dim >= kMax || bytes >= 0x1p62) {
    return absl::InvalidArgumentError(absl::StrCat("DcpExchangeLayout: buffer of ", num_tokens,
                                                   " x ", num_heads, " x ", head_dim,
                                                   " elements is too large"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::kernels

namespace tandem::kernels::cpu {
namespace {

absl::Status CheckCpuLayout(const DcpExchangeLayout& layout, const void* a, const void* b,
                            const char* op) {
  absl::Status status = layout.Validate();
  if (!status.ok()) return absl::InvalidArgumentError(absl::StrCat(op, ": ", status.message()));
  if (layout.elem_bytes != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": the CPU exchange carries fp32 out (elem_bytes 4), got elem_bytes ",
                     layout.elem_bytes));
  }
  if (layout.num_tokens > 0 && (a == nullptr || b == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": null pointer"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DcpPackForExchange(const float* out, const float* lse, const DcpExchangeLayout& layout,
                                void* send) {
  if (absl::Status s = CheckCpuLayout(layout, out, send, "DcpPackForExchange"); !s.ok()) return s;
  if (layout.num_tokens > 0 && lse == nullptr) {
    return absl::InvalidArgumentError("DcpPackForExchange: null lse");
  }
  const int64_t hpr = layout.HeadsPerRank();
  const int64_t d = layout.head_dim;
  auto* base = static_cast<unsigned char*>(send);
  for (int64_t j = 0; j < layout.dcp_size; ++j) {
    unsigned char* region = base + j * layout.RegionBytes();
    auto* dst_out = reinterpret_cast<float*>(region);
    auto* dst_lse = reinterpret_cast<float*>(region + layout.LseOffset());
    for (int64_t t = 0; t < layout.num_tokens; ++t) {
      // The destination's heads of token t are adjacent in out: one contiguous run.
      const int64_t src_row = t * layout.num_heads + j * hpr;
      std::copy_n(out + src_row * d, hpr * d, dst_out + t * hpr * d);
      std::copy_n(lse + src_row, hpr, dst_lse + t * hpr);
    }
  }
  return absl::OkStatus();
}

absl::Status DcpMergeReceived(const void* recv, const DcpExchangeLayout& layout, float* out,
                              float* lse) {
  if (absl::Status s = CheckCpuLayout(layout, recv, out, "DcpMergeReceived"); !s.ok()) return s;
  MergeAttnStatesN(DcpReceivedPartials<float>(recv, layout), layout.num_tokens,
                   layout.HeadsPerRank(), layout.head_dim, out, lse);
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cpu
