#include "kvtransfer/handshake.h"

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tandem/v1/limits.h"

namespace tandem::kvtransfer {
namespace {

using tandem::v1::CompatibilityInfo;
using tandem::v1::TransferHandshake;

CompatibilityInfo GoldenInfo() {
  CompatibilityInfo info;
  info.set_model_id("m");
  info.set_model_dtype("bfloat16");
  tandem::v1::KvLayout* l = info.mutable_layout();
  l->set_layout_name("block_major_v1");
  l->set_num_layers(2);
  l->set_num_kv_heads(4);
  l->set_head_dim(8);
  l->set_block_size(16);
  l->set_kv_dtype(tandem::v1::KV_DTYPE_BF16);
  l->set_scale_granularity(tandem::v1::KV_SCALE_NONE);
  return info;
}

// Python, from the encoding in handshake.h:
//   s = lambda x: struct.pack("<Q", len(x)) + x
//   b = b"tandem-compat-v2" + s(b"m") + s(b"bfloat16") + s(b"block_major_v1") +
//       struct.pack("<IIIIII", 2, 4, 8, 16, 3, 0) + struct.pack("<QQ", 0, 0)
//   hex(struct.unpack("<Q", hashlib.sha256(b).digest()[:8])[0])
TEST(CompatibilityHashTest, GoldenVector) {
  EXPECT_EQ(CompatibilityHash(GoldenInfo()), 0x9e813be338d8ae89ULL);
}

// CompatibilityFor pins what enters the hash: each fact changes it; the rank geometry does not
// enter it at all (it is not part of CompatibilityInfo).
TEST(CompatibilityHashTest, CompatibilityForHashesEveryFactAndNoGeometry) {
  KvCompatibilityFacts facts;
  facts.model_id = "m";
  facts.model_dtype = "bfloat16";
  facts.num_layers = 2;
  facts.num_kv_heads = 4;
  facts.head_dim = 8;
  facts.block_size = 16;
  facts.kv_dtype = tandem::v1::KV_DTYPE_BF16;
  const CompatibilityInfo info = CompatibilityFor(facts);
  EXPECT_EQ(CompatibilityHash(info), CompatibilityHash(GoldenInfo()));
  const std::vector<std::function<void(KvCompatibilityFacts*)>> changes = {
      [](KvCompatibilityFacts* f) { f->model_id = "n"; },
      [](KvCompatibilityFacts* f) { f->model_dtype = "float16"; },
      [](KvCompatibilityFacts* f) { f->num_layers = 3; },
      [](KvCompatibilityFacts* f) { f->num_kv_heads = 8; },
      [](KvCompatibilityFacts* f) { f->head_dim = 16; },
      [](KvCompatibilityFacts* f) { f->block_size = 32; },
      [](KvCompatibilityFacts* f) { f->kv_dtype = tandem::v1::KV_DTYPE_F16; },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    KvCompatibilityFacts changed = facts;
    changes[i](&changed);
    EXPECT_NE(CompatibilityHash(CompatibilityFor(changed)), CompatibilityHash(info)) << i;
  }
  // Two ranks of a TP=2 group and a single-rank worker of the same model hash alike.
  TransferHandshake single, rank1;
  *single.mutable_compatibility() = info;
  *rank1.mutable_compatibility() = info;
  *single.mutable_geometry() = SingleRankGeometry(info, 4096);
  rank1.mutable_geometry()->set_tp_size(2);
  rank1.mutable_geometry()->set_tp_rank(1);
  rank1.mutable_geometry()->set_kv_head_begin(2);
  rank1.mutable_geometry()->set_kv_head_count(2);
  rank1.mutable_geometry()->set_block_bytes(2048);
  EXPECT_EQ(CompatibilityHash(single.compatibility()), CompatibilityHash(rank1.compatibility()));
  EXPECT_TRUE(ValidateGeometry(info, single.geometry()).ok());
  EXPECT_TRUE(ValidateGeometry(info, rank1.geometry()).ok());
}

TEST(RankGeometryTest, GeometryThatContradictsTheLayoutIsInvalid) {
  const CompatibilityInfo info = GoldenInfo();  // 2 layers, 4 heads, head_dim 8, bs 16, bf16
  tandem::v1::RankGeometry g = SingleRankGeometry(info, 4096);
  EXPECT_TRUE(ValidateGeometry(info, g).ok());
  EXPECT_TRUE(ValidateGeometry(info, tandem::v1::RankGeometry()).ok());  // unset: one rank
  tandem::v1::RankGeometry bad = g;
  bad.set_block_bytes(4000);
  EXPECT_EQ(ValidateGeometry(info, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = g;
  bad.set_kv_head_begin(3);  // heads [3, 7) of 4
  EXPECT_EQ(ValidateGeometry(info, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = g;
  bad.set_tp_size(2);
  bad.set_tp_rank(2);
  EXPECT_EQ(ValidateGeometry(info, bad).code(), absl::StatusCode::kInvalidArgument);
}

// Strings are length-prefixed: moving bytes between adjacent strings changes the hash.
TEST(CompatibilityHashTest, StringBoundariesMatter) {
  CompatibilityInfo a = GoldenInfo(), b = GoldenInfo();
  a.set_model_id("ab");
  a.set_model_dtype("c");
  b.set_model_id("a");
  b.set_model_dtype("bc");
  EXPECT_NE(CompatibilityHash(a), CompatibilityHash(b));
}

// One mutation per compared field, in CheckCompatible's documented order.
struct Mutation {
  std::string field;
  std::function<void(TransferHandshake*)> apply;
};

tandem::v1::KvLayout* layout(TransferHandshake* h) {
  return h->mutable_compatibility()->mutable_layout();
}

std::vector<Mutation> Mutations(std::mt19937& rng) {
  const uint32_t bump = 1 + rng() % 7;
  return {
      {"model_id", [](TransferHandshake* h) { h->mutable_compatibility()->set_model_id("other"); }},
      {"model_dtype",
       [](TransferHandshake* h) { h->mutable_compatibility()->set_model_dtype("float16"); }},
      {"kv_dtype",
       [](TransferHandshake* h) { layout(h)->set_kv_dtype(tandem::v1::KV_DTYPE_FP8_E4M3); }},
      {"scale_granularity",
       [](TransferHandshake* h) {
         layout(h)->set_scale_granularity(tandem::v1::KV_SCALE_PER_HEAD);
       }},
      {"k_scales", [](TransferHandshake* h) { h->mutable_compatibility()->add_k_scales(0.5f); }},
      {"v_scales", [](TransferHandshake* h) { h->mutable_compatibility()->add_v_scales(2.0f); }},
      {"layout_name", [](TransferHandshake* h) { layout(h)->set_layout_name("head_major"); }},
      {"block_size",
       [bump](TransferHandshake* h) { layout(h)->set_block_size(layout(h)->block_size() + bump); }},
      {"num_kv_heads",
       [bump](TransferHandshake* h) {
         layout(h)->set_num_kv_heads(layout(h)->num_kv_heads() + bump);
       }},
      {"head_dim",
       [bump](TransferHandshake* h) { layout(h)->set_head_dim(layout(h)->head_dim() + bump); }},
      {"num_layers",
       [bump](TransferHandshake* h) { layout(h)->set_num_layers(layout(h)->num_layers() + bump); }},
      {"transport", [](TransferHandshake* h) { h->set_transport("nccl"); }},
  };
}

TransferHandshake RandomHandshake(std::mt19937& rng, const std::string& worker_id) {
  TransferHandshake h;
  h.set_worker_id(worker_id);
  h.set_epoch(rng());
  CompatibilityInfo* info = h.mutable_compatibility();
  info->set_model_id(absl::StrCat("llama-", rng() % 1000));
  info->set_model_dtype("bfloat16");
  tandem::v1::KvLayout* l = info->mutable_layout();
  l->set_layout_name("block_major_v1");
  l->set_num_layers(1 + rng() % 80);
  l->set_num_kv_heads(1 + rng() % 16);
  l->set_head_dim(64 * (1 + rng() % 4));
  l->set_block_size(16);
  l->set_kv_dtype(tandem::v1::KV_DTYPE_BF16);
  const uint64_t block_bytes =
      uint64_t{2} * l->num_layers() * 2 * l->block_size() * l->num_kv_heads() * l->head_dim();
  *h.mutable_geometry() = SingleRankGeometry(*info, block_bytes);
  h.set_transport("ucx");
  h.set_worker_address(std::string(100 + rng() % 200, 'a'));
  tandem::v1::MemoryRegion* r = h.add_regions();
  r->set_base_address(0x7f0000000000ULL + (rng() % 1000) * 4096);
  r->set_length(block_bytes * (1 + rng() % 100));
  r->set_kind(tandem::v1::MEMORY_KIND_HOST);
  r->set_packed_rkey(std::string(64, 'k'));
  return h;
}

void Rehash(TransferHandshake* h) {
  h->set_compatibility_hash(CompatibilityHash(h->compatibility()));
}

TEST(CheckCompatibleTest, IdenticalFactsAreCompatible) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  TransferHandshake local = RandomHandshake(rng, "d0");
  TransferHandshake peer = local;
  peer.set_worker_id("p0");  // transport fields and ids may differ, facts may not
  peer.set_epoch(local.epoch() + 1);
  peer.set_worker_address("other address");
  Rehash(&local);
  Rehash(&peer);
  EXPECT_TRUE(CheckCompatible(local, peer).ok());
  EXPECT_TRUE(CheckCompatible(peer, local).ok());
}

TEST(CheckCompatibleTest, NamesFirstDifferingField) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  TransferHandshake local = RandomHandshake(rng, "d0");
  Rehash(&local);
  const std::vector<Mutation> mutations = Mutations(rng);
  for (size_t i = 0; i < mutations.size(); ++i) {
    SCOPED_TRACE(mutations[i].field);
    // Mutate field i and every later one: the error must name field i.
    TransferHandshake peer = local;
    peer.set_worker_id("p0");
    for (size_t j = i; j < mutations.size(); ++j) mutations[j].apply(&peer);
    Rehash(&peer);
    const uint64_t before = CompatibilityHash(local.compatibility());
    if (mutations[i].field != "transport") {
      EXPECT_NE(CompatibilityHash(peer.compatibility()), before);
    }
    absl::Status s = CheckCompatible(local, peer);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find(absl::StrCat(mutations[i].field, " differs")), std::string::npos)
        << s;
    EXPECT_NE(s.message().find("p0"), std::string::npos) << s;
    // Only field i: same verdict.
    TransferHandshake single = local;
    mutations[i].apply(&single);
    Rehash(&single);
    absl::Status s1 = CheckCompatible(local, single);
    EXPECT_EQ(s1.code(), absl::StatusCode::kFailedPrecondition) << s1;
    EXPECT_NE(s1.message().find(absl::StrCat(mutations[i].field, " differs")), std::string::npos)
        << s1;
  }
}

TEST(CheckCompatibleTest, ScaleBitsMatter) {
  TransferHandshake local;
  *local.mutable_compatibility() = GoldenInfo();
  local.set_transport("ucx");
  local.mutable_compatibility()->add_k_scales(0.0f);
  TransferHandshake peer = local;
  peer.mutable_compatibility()->set_k_scales(0, -0.0f);  // == 0.0f as floats, different bits
  Rehash(&local);
  Rehash(&peer);
  EXPECT_EQ(CheckCompatible(local, peer).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(CheckCompatibleTest, LyingHashIsInvalidArgument) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  TransferHandshake local = RandomHandshake(rng, "d0");
  Rehash(&local);
  TransferHandshake peer = local;
  peer.mutable_compatibility()->mutable_layout()->set_block_size(32);  // hash not updated
  absl::Status s = CheckCompatible(local, peer);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("compatibility_hash"), std::string::npos) << s;
}

TEST(ValidateHandshakeTest, Limits) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const TransferHandshake good = RandomHandshake(rng, "p0");
  EXPECT_TRUE(ValidateHandshake(good).ok());

  struct Case {
    std::string name;
    std::function<void(TransferHandshake*)> apply;
    std::string expected;  // substring of the message
  };
  const std::vector<Case> cases = {
      {"worker_id",
       [](TransferHandshake* h) {
         h->set_worker_id(std::string(tandem::v1::kMaxIdBytes + 1, 'w'));
       },
       "worker_id"},
      {"worker_address",
       [](TransferHandshake* h) {
         h->set_worker_address(std::string(tandem::v1::kMaxTransportAddressBytes + 1, 'a'));
       },
       "worker_address"},
      {"regions",
       [](TransferHandshake* h) {
         while (h->regions_size() <= tandem::v1::kMaxMemoryRegions)
           *h->add_regions() = h->regions(0);
       },
       "regions"},
      {"packed_rkey",
       [](TransferHandshake* h) {
         h->mutable_regions(0)->set_packed_rkey(
             std::string(tandem::v1::kMaxPackedRkeyBytes + 1, 'k'));
       },
       "packed_rkey"},
      {"zero length", [](TransferHandshake* h) { h->mutable_regions(0)->set_length(0); },
       "bad range"},
      {"wrapping range",
       [](TransferHandshake* h) { h->mutable_regions(0)->set_base_address(~uint64_t{0} - 10); },
       "bad range"},
      {"no kind",
       [](TransferHandshake* h) {
         h->mutable_regions(0)->set_kind(tandem::v1::MEMORY_KIND_UNSPECIFIED);
       },
       "no kind"},
      {"transport", [](TransferHandshake* h) { h->clear_transport(); }, "transport"},
      {"short gather key",
       [](TransferHandshake* h) {
         h->set_ucx_gather_key(std::string(tandem::v1::kUcxGatherKeyBytes - 1, 'g'));
       },
       "ucx_gather_key"},
      {"long gather key",
       [](TransferHandshake* h) {
         h->set_ucx_gather_key(std::string(tandem::v1::kUcxGatherKeyBytes + 1, 'g'));
       },
       "ucx_gather_key"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    TransferHandshake h = good;
    c.apply(&h);
    absl::Status s = ValidateHandshake(h);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(c.expected), std::string::npos) << s;
    // CheckCompatible refuses it the same way, before comparing anything.
    TransferHandshake local = good;
    Rehash(&local);
    Rehash(&h);
    EXPECT_EQ(CheckCompatible(local, h).code(), absl::StatusCode::kInvalidArgument);
  }
  // Exactly at the limits is fine.
  TransferHandshake at_limit = good;
  at_limit.set_worker_id(std::string(tandem::v1::kMaxIdBytes, 'w'));
  at_limit.set_worker_address(std::string(tandem::v1::kMaxTransportAddressBytes, 'a'));
  at_limit.mutable_regions(0)->set_packed_rkey(std::string(tandem::v1::kMaxPackedRkeyBytes, 'k'));
  while (at_limit.regions_size() < tandem::v1::kMaxMemoryRegions) {
    *at_limit.add_regions() = at_limit.regions(0);
  }
  at_limit.set_ucx_gather_key(std::string(tandem::v1::kUcxGatherKeyBytes, 'g'));
  EXPECT_TRUE(ValidateHandshake(at_limit).ok());
}

TEST(RankGeometryTest, SameModelSplitDifferentlyIsNotRefusedAsIncompatible) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  TransferHandshake local = RandomHandshake(rng, "d0");
  const uint32_t heads = local.compatibility().layout().num_kv_heads();
  if (heads % 2 != 0) local.mutable_compatibility()->mutable_layout()->set_num_kv_heads(heads + 1);
  Rehash(&local);
  TransferHandshake peer = local;
  peer.set_worker_id("p0");
  *local.mutable_geometry() = SingleRankGeometry(local.compatibility(), /*block_bytes=*/0);
  tandem::v1::RankGeometry* g = peer.mutable_geometry();
  g->set_tp_size(2);
  g->set_tp_rank(0);
  g->set_kv_head_begin(0);
  g->set_kv_head_count(local.compatibility().layout().num_kv_heads() / 2);
  g->set_block_bytes(0);
  ASSERT_TRUE(CheckGeometry(local, local).ok());
  // A different tensor-parallel split pairs: the reader re-shards the heads (rank_reader.h).
  EXPECT_TRUE(CheckCompatible(local, peer).ok()) << CheckCompatible(local, peer);
  // A decode context-parallel group whose shards hold whole blocks reads from an unsharded
  // source (each rank reads its shard's blocks), either side calling.
  const uint32_t block_size = local.compatibility().layout().block_size();
  TransferHandshake dcp = peer;
  dcp.mutable_geometry()->set_dcp_size(2);
  dcp.mutable_geometry()->set_dcp_interleave(2 * block_size);
  EXPECT_TRUE(CheckCompatible(local, dcp).ok()) << CheckCompatible(local, dcp);
  EXPECT_TRUE(CheckCompatible(dcp, local).ok()) << CheckCompatible(dcp, local);
  // Shards splitting blocks, or two different context-parallel splits, are not re-sharded:
  // UNIMPLEMENTED naming both splits (not FAILED_PRECONDITION: the model and layout are the same).
  if (block_size > 1) {
    TransferHandshake split = dcp;
    split.mutable_geometry()->set_dcp_interleave(block_size - 1);
    const absl::Status s = CheckCompatible(local, split);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
    EXPECT_NE(s.message().find("tp 0/2"), std::string::npos) << s;
  }
  TransferHandshake other = local;
  other.mutable_geometry()->set_dcp_size(4);
  other.mutable_geometry()->set_dcp_interleave(block_size);
  const absl::Status s = CheckCompatible(other, dcp);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("context-parallel"), std::string::npos) << s;
}

// A DeepSeek MLA worker's latent cache (one plane per layer): its layout names the latent split,
// so a GQA worker or an MLA worker of another split is refused naming both; block bytes count one
// plane, not K and V.
TEST(RankGeometryTest, MlaLatentLayoutNamesItsSplitAndHasOnePlane) {
  std::mt19937 rng(5);
  KvCompatibilityFacts facts;
  facts.model_id = "deepseek";
  facts.model_dtype = "bfloat16";
  facts.num_layers = 3;
  facts.num_kv_heads = 1;
  facts.head_dim = 576;
  facts.block_size = 16;
  facts.kv_dtype = tandem::v1::KV_DTYPE_BF16;
  facts.kv_lora_rank = 512;
  facts.qk_rope_head_dim = 64;
  const CompatibilityInfo info = CompatibilityFor(facts);
  EXPECT_EQ(info.layout().layout_name(), "mla_latent_v1(kv_lora_rank=512,qk_rope_head_dim=64)");
  const uint64_t one_plane = 3 * 16 * 576 * 2;
  EXPECT_TRUE(ValidateGeometry(info, SingleRankGeometry(info, one_plane)).ok());
  EXPECT_EQ(ValidateGeometry(info, SingleRankGeometry(info, 2 * one_plane)).code(),
            absl::StatusCode::kInvalidArgument);

  KvCompatibilityFacts other_split = facts;  // the same 576-wide latent, split 448 + 128
  other_split.kv_lora_rank = 448;
  other_split.qk_rope_head_dim = 128;
  KvCompatibilityFacts gqa = facts;  // K and V of one 576-wide head
  gqa.kv_lora_rank = gqa.qk_rope_head_dim = 0;
  TransferHandshake local = RandomHandshake(rng, "d0");
  *local.mutable_compatibility() = info;
  *local.mutable_geometry() = SingleRankGeometry(info, one_plane);
  Rehash(&local);
  for (const KvCompatibilityFacts& f : {other_split, gqa}) {
    TransferHandshake peer = local;
    peer.set_worker_id("p0");
    *peer.mutable_compatibility() = CompatibilityFor(f);
    *peer.mutable_geometry() = SingleRankGeometry(peer.compatibility(), 0);
    Rehash(&peer);
    const absl::Status s = CheckCompatible(local, peer);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("layout_name"), std::string::npos) << s;
    EXPECT_NE(s.message().find("kv_lora_rank=512"), std::string::npos) << s;
  }
  TransferHandshake same = local;
  same.set_worker_id("p1");
  EXPECT_TRUE(CheckCompatible(local, same).ok()) << CheckCompatible(local, same);
}

// Quantized blocks (an FP8 MLA latent: its row scales inside each block) pair across tensor- and
// context-parallel splits only where every read is of whole blocks: both ranks keep the same
// heads (the latent is whole on every rank) in blocks of the same size. A quantized split that
// re-shards heads, or states another block size, is UNIMPLEMENTED naming quantized KV.
TEST(RankGeometryTest, QuantizedBlocksPairOnlyWhereNoHeadIsResharded) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  KvCompatibilityFacts facts;
  facts.model_id = "deepseek";
  facts.model_dtype = "float32";
  facts.num_layers = 1 + rng() % 8;
  facts.num_kv_heads = 1;
  facts.head_dim = 40;
  facts.block_size = 16;
  facts.kv_dtype = tandem::v1::KV_DTYPE_FP8_E4M3;
  facts.scale_granularity = tandem::v1::KV_SCALE_PER_TOKEN_HEAD;
  facts.kv_lora_rank = 32;
  facts.qk_rope_head_dim = 8;
  const uint64_t block_bytes = uint64_t{facts.num_layers} * 16 * (40 + 4);
  TransferHandshake decode = RandomHandshake(rng, "d0");
  *decode.mutable_compatibility() = CompatibilityFor(facts);
  *decode.mutable_geometry() = SingleRankGeometry(decode.compatibility(), block_bytes);
  Rehash(&decode);
  TransferHandshake prefill = decode;  // rank 1 of a TP=2 group, the whole latent
  prefill.set_worker_id("p0");
  prefill.mutable_geometry()->set_tp_size(2);
  prefill.mutable_geometry()->set_tp_rank(1);
  EXPECT_TRUE(CheckCompatible(decode, prefill).ok()) << CheckCompatible(decode, prefill);
  TransferHandshake dcp = decode;  // a TP=2 x DCP=2 decode group's rank: whole blocks per shard
  dcp.mutable_geometry()->set_tp_size(2);
  dcp.mutable_geometry()->set_dcp_size(2);
  dcp.mutable_geometry()->set_dcp_interleave(16);
  EXPECT_TRUE(CheckCompatible(dcp, prefill).ok()) << CheckCompatible(dcp, prefill);
  TransferHandshake other_bytes = prefill;
  other_bytes.mutable_geometry()->set_block_bytes(block_bytes + 16);
  absl::Status s = CheckCompatible(decode, other_bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("quantized KV"), std::string::npos) << s;
  // Quantized K/V heads split over two ranks against one rank holding all of them.
  TransferHandshake gqa = RandomHandshake(rng, "d1");
  gqa.mutable_compatibility()->mutable_layout()->set_num_kv_heads(4);
  gqa.mutable_compatibility()->mutable_layout()->set_kv_dtype(tandem::v1::KV_DTYPE_FP8_E4M3);
  gqa.mutable_compatibility()->mutable_layout()->set_scale_granularity(
      tandem::v1::KV_SCALE_PER_TOKEN_HEAD);
  Rehash(&gqa);
  *gqa.mutable_geometry() = SingleRankGeometry(gqa.compatibility(), 0);
  TransferHandshake half = gqa;
  half.set_worker_id("p1");
  half.mutable_geometry()->set_tp_size(2);
  half.mutable_geometry()->set_kv_head_count(2);
  s = CheckCompatible(gqa, half);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("quantized KV"), std::string::npos) << s;
}

TEST(RankGeometryTest, GroupRanksAreValidated) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  TransferHandshake group = RandomHandshake(rng, "p0");
  group.mutable_compatibility()->mutable_layout()->set_num_kv_heads(4);
  Rehash(&group);
  for (uint32_t r = 0; r < 2; ++r) {
    TransferHandshake* rank = group.add_ranks();
    rank->set_transport(group.transport());
    *rank->mutable_regions() = group.regions();
    rank->mutable_geometry()->set_tp_size(2);
    rank->mutable_geometry()->set_tp_rank(r);
    rank->mutable_geometry()->set_kv_head_begin(2 * r);
    rank->mutable_geometry()->set_kv_head_count(2);
  }
  *group.mutable_geometry() = group.ranks(0).geometry();
  ASSERT_TRUE(ValidateHandshake(group).ok()) << ValidateHandshake(group);
  TransferHandshake local = group;
  local.clear_ranks();
  *local.mutable_geometry() = SingleRankGeometry(local.compatibility(), 0);
  EXPECT_TRUE(CheckCompatible(local, group).ok()) << CheckCompatible(local, group);

  TransferHandshake swapped = group;
  swapped.mutable_ranks(1)->mutable_geometry()->set_tp_rank(0);
  EXPECT_NE(ValidateHandshake(swapped).message().find("ranks[1] says rank 0 of 2"),
            std::string::npos);
  TransferHandshake nested = group;
  *nested.mutable_ranks(0)->add_ranks() = group.ranks(1);
  EXPECT_NE(ValidateHandshake(nested).message().find("nests ranks"), std::string::npos);
  TransferHandshake outside = group;
  outside.mutable_ranks(1)->mutable_geometry()->set_kv_head_begin(3);
  EXPECT_EQ(CheckCompatible(local, outside).code(), absl::StatusCode::kInvalidArgument);
  TransferHandshake too_many = group;
  while (too_many.ranks_size() <= tandem::v1::kMaxGroupRanks)
    *too_many.add_ranks() = group.ranks(0);
  EXPECT_NE(ValidateHandshake(too_many).message().find("ranks > limit"), std::string::npos);
}

}  // namespace
}  // namespace tandem::kvtransfer
