#include "kvtransfer/handshake.h"

#include <glog/logging.h>
#include <openssl/evp.h>

#include <bit>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tandem/v1/limits.h"

namespace tandem::kvtransfer {
namespace {

using tandem::v1::CompatibilityInfo;
using tandem::v1::KvLayout;
using tandem::v1::TransferHandshake;

constexpr char kCompatTag[] = "tandem-compat-v2";

void PutLe(std::string* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>(value >> (8 * i)));
}
void PutStr(std::string* out, const std::string& s) {
  PutLe(out, s.size(), 8);
  out->append(s);
}
void PutFloats(std::string* out, const google::protobuf::RepeatedField<float>& values) {
  PutLe(out, values.size(), 8);
  for (float v : values) PutLe(out, std::bit_cast<uint32_t>(v), 4);
}

// proto3 cannot tell "unset" from 0: 0 ranks or a 0-token interleave mean "one" / "none".
uint32_t OneIfZero(uint32_t v) { return v == 0 ? 1 : v; }

// A geometry with proto3's zeros read as the single-rank defaults of a pool of `num_kv_heads`.
tandem::v1::RankGeometry Normalized(tandem::v1::RankGeometry g, uint32_t num_kv_heads) {
  g.set_tp_size(OneIfZero(g.tp_size()));
  g.set_dcp_size(OneIfZero(g.dcp_size()));
  g.set_dcp_interleave(OneIfZero(g.dcp_interleave()));
  if (g.kv_head_count() == 0) g.set_kv_head_count(num_kv_heads);
  return g;
}

std::string GeometryString(const tandem::v1::RankGeometry& g) {
  return absl::StrCat("tp ", g.tp_rank(), "/", g.tp_size(), ", kv heads [", g.kv_head_begin(), ", ",
                      g.kv_head_begin() + g.kv_head_count(), "), dcp ", g.dcp_size(), " x ",
                      g.dcp_interleave(), ", ", g.block_bytes(), " bytes/block");
}

std::string FloatsToString(const google::protobuf::RepeatedField<float>& values) {
  return absl::StrCat("[", absl::StrJoin(values, ", "), "]");
}

bool SameBits(const google::protobuf::RepeatedField<float>& a,
              const google::protobuf::RepeatedField<float>& b) {
  if (a.size() != b.size()) return false;
  for (int i = 0; i < a.size(); ++i) {
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return false;
  }
  return true;
}

// "<field> differs (local <a>, peer <b>)" for the first differing field, or nullopt.
std::optional<std::string> FirstDifference(const TransferHandshake& local,
                                           const TransferHandshake& peer) {
  const CompatibilityInfo& a = local.compatibility();
  const CompatibilityInfo& b = peer.compatibility();
  const KvLayout& la = a.layout();
  const KvLayout& lb = b.layout();
  auto diff = [](absl::string_view field, const auto& x, const auto& y) {
    return absl::StrCat(field, " differs (local ", x, ", peer ", y, ")");
  };
  auto quoted = [](const std::string& s) { return absl::StrCat("'", s, "'"); };
  if (a.model_id() != b.model_id()) {
    return diff("model_id", quoted(a.model_id()), quoted(b.model_id()));
  }
  if (a.model_dtype() != b.model_dtype()) {
    return diff("model_dtype", quoted(a.model_dtype()), quoted(b.model_dtype()));
  }
  if (la.kv_dtype() != lb.kv_dtype()) {
    return diff("kv_dtype", tandem::v1::KvDtype_Name(la.kv_dtype()),
                tandem::v1::KvDtype_Name(lb.kv_dtype()));
  }
  if (la.scale_granularity() != lb.scale_granularity()) {
    return diff("scale_granularity", tandem::v1::KvScaleGranularity_Name(la.scale_granularity()),
                tandem::v1::KvScaleGranularity_Name(lb.scale_granularity()));
  }
  if (!SameBits(a.k_scales(), b.k_scales())) {
    return diff("k_scales", FloatsToString(a.k_scales()), FloatsToString(b.k_scales()));
  }
  if (!SameBits(a.v_scales(), b.v_scales())) {
    return diff("v_scales", FloatsToString(a.v_scales()), FloatsToString(b.v_scales()));
  }
  if (la.layout_name() != lb.layout_name()) {
    return diff("layout_name", quoted(la.layout_name()), quoted(lb.layout_name()));
  }
  if (la.block_size() != lb.block_size()) {
    return diff("block_size", la.block_size(), lb.block_size());
  }
  if (la.num_kv_heads() != lb.num_kv_heads()) {
    return diff("num_kv_heads", la.num_kv_heads(), lb.num_kv_heads());
  }
  if (la.head_dim() != lb.head_dim()) return diff("head_dim", la.head_dim(), lb.head_dim());
  if (la.num_layers() != lb.num_layers()) {
    return diff("num_layers", la.num_layers(), lb.num_layers());
  }
  if (local.transport() != peer.transport()) {
    return diff("transport", quoted(local.transport()), quoted(peer.transport()));
  }
  return std::nullopt;
}

}  // namespace

std::string CanonicalCompatibilityBytes(const CompatibilityInfo& info) {
  const KvLayout& layout = info.layout();
  std::string out(kCompatTag, sizeof(kCompatTag) - 1);
  PutStr(&out, info.model_id());
  PutStr(&out, info.model_dtype());
  PutStr(&out, layout.layout_name());
  PutLe(&out, layout.num_layers(), 4);
  PutLe(&out, layout.num_kv_heads(), 4);
  PutLe(&out, layout.head_dim(), 4);
  PutLe(&out, layout.block_size(), 4);
  PutLe(&out, static_cast<uint32_t>(layout.kv_dtype()), 4);
  PutLe(&out, static_cast<uint32_t>(layout.scale_granularity()), 4);
  PutFloats(&out, info.k_scales());
  PutFloats(&out, info.v_scales());
  return out;
}

uint64_t CompatibilityHash(const CompatibilityInfo& info) {
  const std::string bytes = CanonicalCompatibilityBytes(info);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  // Fails only when OpenSSL cannot allocate; like block_hash.cc we treat that as fatal rather
  // than return a hash that could falsely match.
  CHECK_EQ(EVP_Digest(bytes.data(), bytes.size(), digest, &size, EVP_sha256(), nullptr), 1)
      << "SHA-256 failed";
  uint64_t hash = 0;
  for (int i = 7; i >= 0; --i) hash = (hash << 8) | digest[i];
  return hash;
}

namespace {

// TransferHandshake.ranks: one entry per rank, in rank order, each a valid descriptor of its own
// (no nested ranks), naming the group's size and its own rank.
absl::Status ValidateGroupRanks(const TransferHandshake& handshake, const std::string& who) {
  const int n = handshake.ranks_size();
  if (n == 0) return absl::OkStatus();
  if (n > tandem::v1::kMaxGroupRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": ", n, " ranks > limit ", tandem::v1::kMaxGroupRanks));
  }
  for (int r = 0; r < n; ++r) {
    const TransferHandshake& rank = handshake.ranks(r);
    if (rank.ranks_size() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": ranks[", r, "] nests ranks"));
    }
    if (rank.geometry().tp_rank() != static_cast<uint32_t>(r) ||
        rank.geometry().tp_size() != static_cast<uint32_t>(n)) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": ranks[", r, "] says rank ", rank.geometry().tp_rank(), " of ",
                       rank.geometry().tp_size(), ", the group lists ", n));
    }
    if (absl::Status s = ValidateHandshake(rank); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": ranks[", r, "]: ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateHandshake(const TransferHandshake& handshake) {
  if (handshake.worker_id().size() > static_cast<size_t>(tandem::v1::kMaxIdBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("handshake worker_id has ",
                                                   handshake.worker_id().size(), " bytes > limit ",
                                                   tandem::v1::kMaxIdBytes));
  }
  const std::string who = absl::StrCat("handshake of '", handshake.worker_id(), "'");
  if (handshake.worker_address().size() >
      static_cast<size_t>(tandem::v1::kMaxTransportAddressBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": worker_address has ", handshake.worker_address().size(),
                     " bytes > limit ", tandem::v1::kMaxTransportAddressBytes));
  }
  if (handshake.transport().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": empty transport"));
  }
  if (handshake.access_token().size() > static_cast<size_t>(tandem::v1::kMaxAccessTokenBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": access_token has ", handshake.access_token().size(), " bytes > limit ",
                     tandem::v1::kMaxAccessTokenBytes));
  }
  if (!handshake.ucx_gather_key().empty() &&
      handshake.ucx_gather_key().size() != static_cast<size_t>(tandem::v1::kUcxGatherKeyBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": ucx_gather_key has ", handshake.ucx_gather_key().size(),
                     " bytes, want 0 or ", tandem::v1::kUcxGatherKeyBytes));
  }
  if (handshake.regions_size() > tandem::v1::kMaxMemoryRegions) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": ", handshake.regions_size(), " regions > limit ", tandem::v1::kMaxMemoryRegions));
  }
  for (int i = 0; i < handshake.regions_size(); ++i) {
    const tandem::v1::MemoryRegion& r = handshake.regions(i);
    if (r.packed_rkey().size() > static_cast<size_t>(tandem::v1::kMaxPackedRkeyBytes)) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": regions[", i, "].packed_rkey has ",
                                                     r.packed_rkey().size(), " bytes > limit ",
                                                     tandem::v1::kMaxPackedRkeyBytes));
    }
    if (r.length() == 0 || r.base_address() + r.length() < r.base_address()) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": regions[", i, "] has bad range [",
                                                     r.base_address(), ", +", r.length(), ")"));
    }
    if (r.kind() == tandem::v1::MEMORY_KIND_UNSPECIFIED) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": regions[", i, "] has no kind"));
    }
  }
  return ValidateGroupRanks(handshake, who);
}

absl::Status CheckCompatible(const TransferHandshake& local, const TransferHandshake& peer) {
  if (absl::Status s = ValidateHandshake(peer); !s.ok()) return s;
  const uint64_t peer_hash = CompatibilityHash(peer.compatibility());
  if (peer.compatibility_hash() != peer_hash) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer '", peer.worker_id(), "' sent compatibility_hash ",
                     absl::Hex(peer.compatibility_hash(), absl::kZeroPad16),
                     " that does not match its CompatibilityInfo (", absl::Hex(peer_hash), ")"));
  }
  if (std::optional<std::string> d = FirstDifference(local, peer); d.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("incompatible peer ", peer.worker_id(), ": ", *d));
  }
  if (absl::Status s = ValidateGeometry(peer.compatibility(), peer.geometry()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("peer '", peer.worker_id(), "': ", s.message()));
  }
  for (int r = 0; r < peer.ranks_size(); ++r) {
    if (absl::Status s = ValidateGeometry(peer.compatibility(), peer.ranks(r).geometry());
        !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("peer '", peer.worker_id(), "' rank ", r, ": ", s.message()));
    }
  }
  return CheckGeometry(local, peer);
}

tandem::v1::CompatibilityInfo CompatibilityFor(const KvCompatibilityFacts& facts) {
  tandem::v1::CompatibilityInfo info;
  info.set_model_id(facts.model_id);
  info.set_model_dtype(facts.model_dtype);
  KvLayout* layout = info.mutable_layout();
  layout->set_layout_name(facts.kv_lora_rank == 0
                              ? std::string("block_major_v1")
                              : absl::StrCat(kMlaLatentLayout, "(kv_lora_rank=", facts.kv_lora_rank,
                                             ",qk_rope_head_dim=", facts.qk_rope_head_dim, ")"));
  layout->set_num_layers(facts.num_layers);
  layout->set_num_kv_heads(facts.num_kv_heads);
  layout->set_head_dim(facts.head_dim);
  layout->set_block_size(facts.block_size);
  layout->set_kv_dtype(facts.kv_dtype);
  layout->set_scale_granularity(facts.scale_granularity);
  for (float s : facts.k_scales) info.add_k_scales(s);
  for (float s : facts.v_scales) info.add_v_scales(s);
  return info;
}

tandem::v1::RankGeometry SingleRankGeometry(const tandem::v1::CompatibilityInfo& info,
                                            uint64_t block_bytes) {
  tandem::v1::RankGeometry g;
  g.set_tp_size(1);
  g.set_tp_rank(0);
  g.set_kv_head_begin(0);
  g.set_kv_head_count(info.layout().num_kv_heads());
  g.set_dcp_size(1);
  g.set_dcp_interleave(1);
  g.set_block_bytes(block_bytes);
  return g;
}

uint64_t KvElementBytes(const KvLayout& layout) {
  switch (layout.kv_dtype()) {
    case tandem::v1::KV_DTYPE_F32:
      return 4;
    case tandem::v1::KV_DTYPE_F16:
    case tandem::v1::KV_DTYPE_BF16:
      return 2;
    case tandem::v1::KV_DTYPE_FP8_E4M3:
      return layout.scale_granularity() == tandem::v1::KV_SCALE_PER_TENSOR ? 1 : 0;
    default:
      return 0;
  }
}

absl::Status ValidateGeometry(const tandem::v1::CompatibilityInfo& info,
                              const tandem::v1::RankGeometry& geometry) {
  const KvLayout& l = info.layout();
  const tandem::v1::RankGeometry g = Normalized(geometry, l.num_kv_heads());
  if (g.tp_rank() >= g.tp_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank geometry: tp_rank ", g.tp_rank(), " of tp_size ", g.tp_size()));
  }
  if (uint64_t{g.kv_head_begin()} + g.kv_head_count() > l.num_kv_heads()) {
    return absl::InvalidArgumentError(absl::StrCat("rank geometry: kv heads [", g.kv_head_begin(),
                                                   ", ", g.kv_head_begin() + g.kv_head_count(),
                                                   ") outside the model's ", l.num_kv_heads()));
  }
  const uint64_t elem_bytes = KvElementBytes(l);
  // Quantized blocks carry scales: their size is the backend's.
  if (elem_bytes == 0) return absl::OkStatus();
  // An MLA latent layout has one plane per layer, K and V layouts two.
  const uint64_t planes = absl::StartsWith(l.layout_name(), kMlaLatentLayout) ? 1 : 2;
  const uint64_t want = uint64_t{l.num_layers()} * planes * l.block_size() * g.kv_head_count() *
                        l.head_dim() * elem_bytes;
  if (g.block_bytes() != 0 && g.block_bytes() != want) {  // 0: not stated
    return absl::InvalidArgumentError(absl::StrCat("rank geometry: ", g.block_bytes(),
                                                   " bytes per block; the layout and ",
                                                   g.kv_head_count(), " kv heads make ", want));
  }
  return absl::OkStatus();
}

absl::Status CheckGeometry(const TransferHandshake& local, const TransferHandshake& peer) {
  const uint32_t heads = local.compatibility().layout().num_kv_heads();
  const tandem::v1::RankGeometry a = Normalized(local.geometry(), heads);
  const tandem::v1::RankGeometry b = Normalized(peer.geometry(), heads);
  if (a.tp_size() == b.tp_size() && a.tp_rank() == b.tp_rank() &&
      a.kv_head_begin() == b.kv_head_begin() && a.kv_head_count() == b.kv_head_count() &&
      a.dcp_size() == b.dcp_size() && a.dcp_interleave() == b.dcp_interleave() &&
      a.block_bytes() == b.block_bytes()) {
    return absl::OkStatus();
  }
  // Same model and layout, different split over tensor-parallel ranks: reconciled by the reader
  // (rank_reader.h re-shards heads in bulk). A decode context-parallel group reads from an
  // unsharded source when its shards hold whole blocks (each rank reads its shard's blocks,
  // runtime/parallel/group_kv.h); other context-parallel pairs are not re-sharded. Quantized
  // blocks with their scales inside (KvElementBytes 0; FP8 per tensor keeps its scales outside and
  // re-shards as 16-bit KV does) are not re-sharded either: they pair across splits only
  // where both ranks keep the same heads in blocks of the same size (a DeepSeek MLA latent, whole
  // on every rank), so every read is of whole blocks (rank_reader.h: direct).
  const bool same_heads = a.kv_head_begin() == b.kv_head_begin() &&
                          a.kv_head_count() == b.kv_head_count() &&
                          a.block_bytes() == b.block_bytes();
  const bool quantized = KvElementBytes(local.compatibility().layout()) == 0 && !same_heads;
  const bool same_dcp = a.dcp_size() == b.dcp_size() && a.dcp_interleave() == b.dcp_interleave();
  const uint32_t block_size = local.compatibility().layout().block_size();
  const tandem::v1::RankGeometry& sharded = a.dcp_size() > 1 ? a : b;
  const tandem::v1::RankGeometry& plain = a.dcp_size() > 1 ? b : a;
  const bool whole_blocks =
      plain.dcp_size() == 1 && block_size > 0 && sharded.dcp_interleave() % block_size == 0;
  if (quantized || (!same_dcp && !whole_blocks)) {
    return absl::UnimplementedError(absl::StrCat(
        "peer ", peer.worker_id(), " splits the same KV differently (local ", GeometryString(a),
        "; peer ", GeometryString(b), "): re-sharding ",
        quantized ? "quantized KV"
                  : "between context-parallel shapes (only an unsharded side with a side whose "
                    "dcp_interleave is a multiple of the block size)",
        " is not implemented"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::kvtransfer
