// The KV facts a worker states in its handshake (KvLayoutInfo) for DeepSeek MLA: the latent layout
// (one row of kv_lora_rank + qk_rope_head_dim per token and layer), named with its split, so a
// P and a D of different MLA dims, or an MLA and a GQA worker, refuse to pair naming both; its
// block bytes (KvBlockBytes) are what ValidateGeometry expects of one plane; an FP8 latent pairs
// only with an FP8 latent.
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvtransfer/handshake.h"
#include "runtime/engine/kv_layout.h"
#include "runtime/model/model_config.h"
#include "runtime/parallel/group_kv.h"

namespace tandem::runtime {
namespace {

ModelConfig Mla(int kv_lora_rank, int rope_dim) {
  auto c = ParseModelConfig(absl::StrCat(
      R"({"architectures": ["DeepseekV2ForCausalLM"], "vocab_size": 64, "hidden_size": 32,
          "intermediate_size": 48, "num_hidden_layers": 3, "num_attention_heads": 4,
          "first_k_dense_replace": 3, "q_lora_rank": null, "qk_nope_head_dim": 8,
          "v_head_dim": 8, "kv_lora_rank": )",
      kv_lora_rank, R"(, "qk_rope_head_dim": )", rope_dim, "}"));
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

tandem::v1::TransferHandshake Handshake(const ModelConfig& model, const std::string& id,
                                        KvDtype dtype = KvDtype::kF32) {
  tandem::v1::TransferHandshake h;
  h.set_worker_id(id);
  h.set_transport("ucx");
  *h.mutable_compatibility() = KvLayoutInfo(model, 16, dtype);
  h.mutable_compatibility()->set_model_id("m");
  *h.mutable_geometry() = kvtransfer::SingleRankGeometry(
      h.compatibility(), static_cast<uint64_t>(KvBlockBytes(model, 16, dtype)));
  h.set_compatibility_hash(kvtransfer::CompatibilityHash(h.compatibility()));
  return h;
}

TEST(KvLayoutInfoTest, MlaLatentLayoutPairsOnlyWithTheSameSplit) {
  const ModelConfig a = Mla(32, 8);
  const tandem::v1::CompatibilityInfo info = KvLayoutInfo(a, 16, KvDtype::kF32);
  EXPECT_EQ(info.layout().layout_name(), "mla_latent_v1(kv_lora_rank=32,qk_rope_head_dim=8)");
  EXPECT_EQ(info.layout().num_kv_heads(), 1u);
  EXPECT_EQ(info.layout().head_dim(), 40u);
  const tandem::v1::TransferHandshake p = Handshake(a, "p0");
  EXPECT_TRUE(kvtransfer::ValidateGeometry(p.compatibility(), p.geometry()).ok());
  EXPECT_TRUE(kvtransfer::CheckCompatible(p, Handshake(a, "d0")).ok());

  const tandem::v1::TransferHandshake other = Handshake(Mla(24, 16), "d1");
  const absl::Status s = kvtransfer::CheckCompatible(p, other);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("kv_lora_rank=24,qk_rope_head_dim=16"), std::string::npos) << s;
  EXPECT_NE(s.message().find("kv_lora_rank=32,qk_rope_head_dim=8"), std::string::npos) << s;
}

// --kv_cache_dtype=fp8 (kv_layout.h): the latent's dtype and its per-token scales enter the
// hash, so a P and a D whose latent pools differ in dtype refuse to pair, naming both dtypes.
TEST(KvLayoutInfoTest, Fp8LatentPairsOnlyWithFp8) {
  const ModelConfig a = Mla(32, 8);
  const tandem::v1::CompatibilityInfo info = KvLayoutInfo(a, 16, KvDtype::kFp8E4m3);
  EXPECT_EQ(info.layout().kv_dtype(), tandem::v1::KV_DTYPE_FP8_E4M3);
  EXPECT_EQ(info.layout().scale_granularity(), tandem::v1::KV_SCALE_PER_TOKEN_HEAD);
  const tandem::v1::TransferHandshake p = Handshake(a, "p0", KvDtype::kFp8E4m3);
  EXPECT_TRUE(kvtransfer::ValidateGeometry(p.compatibility(), p.geometry()).ok());
  EXPECT_TRUE(kvtransfer::CheckCompatible(p, Handshake(a, "d0", KvDtype::kFp8E4m3)).ok());
  for (KvDtype other : {KvDtype::kBf16, KvDtype::kF32}) {
    const absl::Status s = kvtransfer::CheckCompatible(p, Handshake(a, "d1", other));
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("fp8_e4m3"), std::string::npos) << s;
    EXPECT_NE(s.message().find(KvDtypeName(other)), std::string::npos) << s;
  }
}

// A GQA model's FP8 K / V (CUDA, --kv_cache_dtype=fp8): one scale per tensor for K and for V,
// stated in the hash (KV_SCALE_PER_TENSOR, k_scales / v_scales), outside the blocks; so the
// blocks are one byte a value and re-shard by heads between different TP splits, while a 16-bit
// peer, or one of other scales, refuses to pair.
TEST(KvLayoutInfoTest, GqaFp8PerTensorScalesReshardAcrossTpSplits) {
  const ModelConfig llama = *PresetConfig("llama3-8b");  // 8 KV heads of 128
  const tandem::v1::CompatibilityInfo info = KvLayoutInfo(llama, 16, KvDtype::kFp8E4m3);
  EXPECT_EQ(info.layout().scale_granularity(), tandem::v1::KV_SCALE_PER_TENSOR);
  ASSERT_EQ(info.k_scales_size(), 1);
  ASSERT_EQ(info.v_scales_size(), 1);
  EXPECT_EQ(info.k_scales(0), kFp8KvTensorScale);
  EXPECT_EQ(kvtransfer::KvElementBytes(info.layout()), 1u);
  const tandem::v1::TransferHandshake p = Handshake(llama, "p0", KvDtype::kFp8E4m3);
  EXPECT_TRUE(kvtransfer::ValidateGeometry(p.compatibility(), p.geometry()).ok());
  // A decode rank of a TP = 2 group: KV heads [4, 8), half of each block.
  tandem::v1::TransferHandshake d = Handshake(llama, "d0", KvDtype::kFp8E4m3);
  tandem::v1::RankGeometry* g = d.mutable_geometry();
  g->set_tp_size(2);
  g->set_tp_rank(1);
  g->set_kv_head_begin(4);
  g->set_kv_head_count(4);
  g->set_block_bytes(static_cast<uint64_t>(KvBlockBytes(llama, 16, KvDtype::kFp8E4m3, {4, 4})));
  EXPECT_TRUE(kvtransfer::ValidateGeometry(d.compatibility(), d.geometry()).ok());
  EXPECT_TRUE(kvtransfer::CheckCompatible(p, d).ok()) << kvtransfer::CheckCompatible(p, d);
  g->set_block_bytes(g->block_bytes() * 2);  // codes of 2 bytes: contradicts the layout
  EXPECT_EQ(kvtransfer::CheckCompatible(p, d).code(), absl::StatusCode::kInvalidArgument);

  const absl::Status s = kvtransfer::CheckCompatible(p, Handshake(llama, "d1", KvDtype::kBf16));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("fp8_e4m3"), std::string::npos) << s;
  tandem::v1::TransferHandshake other = Handshake(llama, "d2", KvDtype::kFp8E4m3);
  other.mutable_compatibility()->set_k_scales(0, 0.5f);
  other.set_compatibility_hash(kvtransfer::CompatibilityHash(other.compatibility()));
  const absl::Status scales = kvtransfer::CheckCompatible(p, other);
  EXPECT_EQ(scales.code(), absl::StatusCode::kFailedPrecondition) << scales;
  EXPECT_NE(scales.message().find("k_scales"), std::string::npos) << scales;
}

}  // namespace
}  // namespace tandem::runtime
