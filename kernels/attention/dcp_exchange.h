// The per-layer exchange of decode context parallelism (ARCHITECTURE.md, "Decode context
// parallelism"): after shard attention every one of the KVP ranks holds a partial (out, lse) for
// ALL its H_local query heads over ITS keys; one all-to-all among them leaves rank j with the
// KVP partials of heads [j * H_local / KVP, (j + 1) * H_local / KVP), which it merges by LSE.
//
// Wire layout (one buffer, so one all-to-all moves out and lse together):
//
//   send buffer of rank k  = KVP regions; region j goes to rank j
//   recv buffer of rank j  = KVP regions; region k came from rank k
//   (an all-to-all of equal counts: region j of k's send buffer lands as region k of j's recv
//    buffer, e.g. grouped ncclSend/ncclRecv of RegionBytes() each, or all_to_all_single)
//
//   one region, hpr = H_local / KVP heads, byte offsets:
//     [0, OutBytes())                      out[t][h'][d] = sender's out[t][j * hpr + h'][d],
//                                          [num_tokens][hpr][head_dim], model dtype
//                                          (elem_bytes each: fp32 on the CPU, bf16/fp16 on CUDA)
//     [OutBytes(), LseOffset())            padding to kDcpExchangeAlign (not written)
//     [LseOffset(), + 4 * num_tokens * hpr) lse[t][h'] = sender's lse[t][j * hpr + h'], fp32
//     [..., RegionBytes())                 padding to kDcpExchangeAlign (not written)
//
// Every region and every lse part starts at a multiple of kDcpExchangeAlign bytes of a buffer
// that is itself so aligned, so the fp32 lse is 4-byte aligned and the CUDA kernels can move
// 16-byte vectors. The receiver reads the regions in place: DcpReceivedPartials is the merge's
// input (no unpack copy), and DcpMergeReceived is unpack + N-way merge in one call.
//
// All ranks of a DCP group run the same batch, so num_tokens (hence RegionBytes) is the same on
// every rank. Thread safety: plain values and pure functions.
#ifndef TANDEM_KERNELS_ATTENTION_DCP_EXCHANGE_H_
#define TANDEM_KERNELS_ATTENTION_DCP_EXCHANGE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/attention/merge_attn_states.h"

namespace tandem::kernels {

// Alignment, in bytes, of every region and lse part of the exchange buffer.
inline constexpr int64_t kDcpExchangeAlign = 16;

struct DcpExchangeLayout {
  int64_t num_tokens = 0;  // rows of the step's out (query tokens; a padded bound under graphs)
  int64_t num_heads = 0;   // H_local: query heads each rank attended, a multiple of dcp_size
  int64_t head_dim = 0;
  int64_t dcp_size = 1;    // KVP, ranks in the exchange
  int64_t elem_bytes = 4;  // bytes of one out element: 4 (fp32, CPU) or 2 (bf16/fp16, CUDA)

  static constexpr int64_t AlignUp(int64_t bytes) {
    return (bytes + kDcpExchangeAlign - 1) / kDcpExchangeAlign * kDcpExchangeAlign;
  }
  // Heads each rank owns after the exchange (and merges): H_local / KVP.
  int64_t HeadsPerRank() const { return num_heads / dcp_size; }
  int64_t OutBytes() const { return num_tokens * HeadsPerRank() * head_dim * elem_bytes; }
  int64_t LseOffset() const { return AlignUp(OutBytes()); }
  int64_t RegionBytes() const { return AlignUp(LseOffset() + num_tokens * HeadsPerRank() * 4); }
  // Size of the send buffer and of the receive buffer.
  int64_t BufferBytes() const { return dcp_size * RegionBytes(); }

  // INVALID_ARGUMENT unless num_tokens >= 0, num_heads > 0, head_dim > 0, dcp_size >= 1,
  // num_heads % dcp_size == 0, elem_bytes 2 or 4, and BufferBytes() < 2^62.
  absl::Status Validate() const;
};

// The receive buffer's regions as the N-way merge's input (DcpExchangeLayout's file comment).
// T must be the model dtype of elem_bytes bytes; recv: layout.BufferBytes() bytes, 16-byte
// aligned. Partial k is source rank k's; rows are [num_tokens, HeadsPerRank()].
template <typename T>
AttnPartials<T> DcpReceivedPartials(const void* recv, const DcpExchangeLayout& layout) {
  const auto* base = static_cast<const unsigned char*>(recv);
  AttnPartials<T> parts;
  parts.out = reinterpret_cast<const T*>(base);
  parts.out_stride = layout.RegionBytes() / static_cast<int64_t>(sizeof(T));
  parts.lse = reinterpret_cast<const float*>(base + layout.LseOffset());
  parts.lse_stride = layout.RegionBytes() / static_cast<int64_t>(sizeof(float));
  parts.num_parts = layout.dcp_size;
  return parts;
}

}  // namespace tandem::kernels

namespace tandem::kernels::cpu {

// Packs this rank's shard-attention result for the exchange. out: [num_tokens, num_heads,
// head_dim] fp32; lse: [num_tokens, num_heads] fp32 (PagedAttention's); send: layout.BufferBytes()
// bytes, 16-byte aligned, written as the file comment says (padding untouched).
// INVALID_ARGUMENT on an invalid layout, elem_bytes != 4, or null pointers (when there is data).
absl::Status DcpPackForExchange(const float* out, const float* lse, const DcpExchangeLayout& layout,
                                void* send);

// Unpack + N-way merge of a received buffer (MergeAttnStatesN over DcpReceivedPartials): out:
// [num_tokens, HeadsPerRank(), head_dim] fp32, lse: [num_tokens, HeadsPerRank()] or null. These
// are heads [j * HeadsPerRank(), (j + 1) * HeadsPerRank()) of H_local on rank j. An empty shard
// (lse -inf) contributes nothing; all empty gives 0 / -inf. Same errors as DcpPackForExchange.
absl::Status DcpMergeReceived(const void* recv, const DcpExchangeLayout& layout, float* out,
                              float* lse);

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_KERNELS_ATTENTION_DCP_EXCHANGE_H_
