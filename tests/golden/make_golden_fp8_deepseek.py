#!/usr/bin/env python3
"""Makes the FP8 DeepSeek-V3 golden fixture (issue 38): a tiny random DeepSeek-V3 model (MLA
attention, one dense layer, one MoE layer with routed and shared experts) written by our own
writer in DeepSeek's checkpoint format (quant_method "fp8", weight_block_size [128, 128]: every
decoder projection e4m3 with an F32 weight_scale_inv per 128x128 block, partial blocks at the
edges; embeddings, norms, the router and lm_head bf16), and what transformers computes in f32
with the same weights dequantized (code * scale).

  OUT/fp8_deepseek_v3/: config.json, generation_config.json, model.safetensors, expected.json

Quantized as DeepSeek-V3's released checkpoint is (its index: q_a_proj, q_b_proj,
kv_a_proj_with_mqa, kv_b_proj, o_proj, mlp.{gate,up,down}_proj, mlp.experts.*.*,
mlp.shared_experts.* carry weight_scale_inv; mlp.gate.weight does not).

  python3 tests/golden/make_golden_fp8_deepseek.py --out DIR

Needs PyTorch (float8_e4m3fn) and transformers; CPU only, one thread, deterministic.
"""

import argparse
import json
import os
import random
import shutil
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, DeepseekV3Config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden_fp8 as f8  # noqa: E402

SEED = 38
# hidden 256 = two 128-blocks; q_lora_rank 192 and kv_a's 128 + 64 rows end in partial blocks.
# DeepSeek-V3's head dims (nope 128, rope 64, v 128) and 4 heads, so a TP=2 rank's q_b_proj /
# kv_b_proj rows and o_proj columns (2 heads) fall on 128-block boundaries, as V3's do at TP=8;
# each expert's 128 rows are one block row: expert parallelism keeps experts whole, a TP=2 split
# of them cuts a block (refused); the shared expert (2 x 128 = 256 rows) splits at TP=2 on a block
# boundary, as V3's 2048 do at TP=8.
CONFIG = dict(vocab_size=256, hidden_size=256, intermediate_size=256, moe_intermediate_size=128,
              num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4,
              num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
              n_shared_experts=2, n_group=1, topk_group=1, norm_topk_prob=True,
              routed_scaling_factor=2.5, q_lora_rank=192, kv_lora_rank=128,
              qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, head_dim=64,
              rope_interleave=True, max_position_embeddings=512, rms_norm_eps=1e-5,
              bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
              num_nextn_predict_layers=0,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
QUANT = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
         "weight_block_size": [f8.BLOCK, f8.BLOCK]}
PROMPT_LENGTHS = [1, 4, 9, 33]
MAX_NEW_TOKENS = 4


def quantized(name):
    return name.endswith("proj.weight") or name.endswith("proj_with_mqa.weight")


def random_model(cfg):
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                v = 1.0 + 0.2 * torch.randn(p.shape, generator=gen)
            elif "embed_tokens" in name:
                v = 0.5 * torch.randn(p.shape, generator=gen)
            else:
                v = 0.08 * torch.randn(p.shape, generator=gen)
            p.copy_(v.to(torch.bfloat16).float())
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_((0.05 * torch.randn(b.shape, generator=gen)).to(torch.bfloat16).float())
    return model


@torch.no_grad()
def reference(path, prompts):
    model, info = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:  # every weight must come from the dequantized checkpoint
        sys.exit(f"transformers did not load the dequantized weights exactly: {bad}")
    model.eval()
    logits, gaps, greedy = [], [], []
    for p in prompts:
        seq, toks = list(p), []
        for step in range(MAX_NEW_TOKENS):
            last = model(torch.tensor([seq])).logits[0, -1].float()
            if step == 0:
                top = torch.topk(last, 2)
                logits.append([float(x) for x in last])
                gaps.append(float(top.values[0] - top.values[1]))
            toks.append(int(last.argmax()))
            seq.append(toks[-1])
        greedy.append(toks)
    return logits, gaps, greedy


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    cfg = DeepseekV3Config(**CONFIG)
    model = random_model(cfg)
    rng = random.Random(SEED)
    prompts = [[rng.randrange(3, CONFIG["vocab_size"]) for _ in range(n)] for n in PROMPT_LENGTHS]
    out = os.path.join(args.out, "fp8_deepseek_v3")
    shutil.rmtree(out, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)  # the hub's per-expert names
        state = load_file(os.path.join(tmp, "model.safetensors"))
        tensors, deq = {}, {}
        for name, w in state.items():
            if not quantized(name):
                tensors[name] = w.to(torch.bfloat16)
                deq[name] = w.to(torch.bfloat16).float()
                continue
            codes, scale, d = f8.quant_block(w.float())
            tensors[name] = codes
            tensors[name[:-len("weight")] + "weight_scale_inv"] = scale.float()
            deq[name] = d
        save_file({k: v.contiguous() for k, v in deq.items()},
                  os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        logits, gaps, greedy = reference(tmp, prompts)
    cfg.save_pretrained(out)
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    config["dtype"] = "bfloat16"
    config["quantization_config"] = QUANT
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())},
              os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    maxabs = [max(abs(x) for x in row) for row in logits]
    expected = {"format": "fp8_deepseek_v3", "prompts": prompts, "last_prompt_logits": logits,
                "top2_gap": gaps, "greedy_tokens": greedy, "max_new_tokens": MAX_NEW_TOKENS,
                "reference": "transformers f32 on the dequantized weights",
                "versions": {"torch": torch.__version__,
                             "transformers": __import__("transformers").__version__}}
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f)
        f.write("\n")
    print("gap / max|logit|:", [round(g / m, 4) for g, m in zip(gaps, maxabs)],
          "greedy:", greedy, flush=True)


if __name__ == "__main__":
    main()
