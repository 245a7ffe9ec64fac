#!/usr/bin/env python3
"""Makes the FP8 DeepSeek-V3 golden fixture (issue 38): a tiny random DeepSeek-V3 model (MLA
attention, one dense layer, one MoE layer with routed and shared experts) written by our own
writer in DeepSeek's checkpoint format (quant_method "fp8", weight_block_size [128, 128]: every
decoder projection e4m3 with an F32 weight_scale_inv per 128x128 block, partial blocks at the
edges; embeddings, norms, the router and lm_head bf16), and what transformers computes in f32
with the same weights dequantized (code * scale).

  OUT/fp8_deepseek_v3/: config.json, generation_config.json, model.safetensors, expected.json,
                        expected_mtp.json

With its multi-token prediction layer model.layers.2.* (num_nextn_predict_layers 1), in the
released checkpoints' format too: the layer's decoder block (MLA + DeepSeek's MoE layer) e4m3 with
128x128 weight_scale_inv, its glue (enorm, hnorm, eh_proj, shared_head.norm) and its copies of
embed_tokens / shared_head.head bf16 (as DeepSeek-V3's index has them). expected_mtp.json is
make_golden_mtp.py's record for this model: on prompt 3 and its greedy continuation (T tokens) the
target's final hidden states, the MTP layer's output and logits at positions 0 .. T - 2 and one
chained draft, transformers' DeepseekV3DecoderLayer in f32 on the dequantized weights with vLLM's
glue (make_golden_mtp.Mtp). The MTP weights come from their own generator (seed 1000 + s, s the
first seed whose MTP and target routing on the sequence are clear by >= 1e-4), so the model's
tensors and expected.json are those of the fixture without the layer.

Quantized as DeepSeek-V3's released checkpoint is (its index: q_a_proj, q_b_proj,
kv_a_proj_with_mqa, kv_b_proj, o_proj, mlp.{gate,up,down}_proj, mlp.experts.*.*,
mlp.shared_experts.* carry weight_scale_inv; mlp.gate.weight does not).

  python3 tests/golden/make_golden_fp8_deepseek.py --out DIR

Needs PyTorch (float8_e4m3fn) and transformers; CPU only, one thread, deterministic.
"""

import argparse
import copy
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
import make_golden_mtp as mm  # noqa: E402

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
MTP_PROMPT = 3  # the MTP record's sequence: this prompt and its greedy continuation


def quantized(name):
    if name.endswith("eh_proj.weight"):  # the MTP glue: bf16 in DeepSeek-V3's checkpoint
        return False
    return name.endswith("proj.weight") or name.endswith("proj_with_mqa.weight")


def quantize(state):
    """The checkpoint tensors (e4m3 + weight_scale_inv, or bf16) and the dequantized f32 ones."""
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
    return tensors, deq


def random_model(cfg, seed=SEED):
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    gen = torch.Generator().manual_seed(seed)
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
    return model, logits, gaps, greedy


def rounded(rows):
    """f32 values as JSON numbers of 8 significant digits (exact enough; a third of the size)."""
    if isinstance(rows, list):
        return [rounded(r) for r in rows]
    return float(f"{rows:.8g}")


@torch.no_grad()
def mtp_layer(target, tokens, tmp):
    """The MTP layer model.layers.N.* (checkpoint tensors) and its record on `tokens`."""
    n = target.config.num_hidden_layers
    moe_in = {}  # the target's own routing on the sequence (its MoE layer n - 1) must be clear
    hook = target.model.layers[n - 1].mlp.register_forward_hook(
        lambda mod, args, out: moe_in.__setitem__("x", args[0].detach()))
    hidden = target.model(tokens[None]).last_hidden_state[0]
    hook.remove()
    target_gap = mm.routing_gap(target.model.layers[n - 1].mlp, moe_in["x"][0])
    cfg = copy.deepcopy(target.config)
    cfg.num_hidden_layers = n + 1
    p = f"model.layers.{n}."
    for seed in range(1, 41):
        big = random_model(cfg, 1000 + seed)  # layer n is the MTP block; the others unused
        big_dir = os.path.join(tmp, f"mtp{seed}")
        big.save_pretrained(big_dir, safe_serialization=True)
        state = load_file(os.path.join(big_dir, "model.safetensors"))
        tensors, deq = quantize(state)
        save_file({k: v.contiguous() for k, v in deq.items()},
                  os.path.join(big_dir, "model.safetensors"), metadata={"format": "pt"})
        block = AutoModelForCausalLM.from_pretrained(
            big_dir, dtype=torch.float32, attn_implementation="eager").eval().model.layers[n]
        mtp = mm.Mtp(target, block, seed)
        gen = torch.Generator().manual_seed(2000 + seed)  # the glue, drawn as the model's tensors
        h = cfg.hidden_size
        for norm in (mtp.enorm, mtp.hnorm, mtp.shared_norm):
            norm.weight.copy_((1.0 + 0.2 * torch.randn(h, generator=gen)).to(torch.bfloat16))
        mtp.eh_proj.weight.copy_((0.08 * torch.randn(h, 2 * h, generator=gen)).to(torch.bfloat16))
        t = tokens.shape[0]
        y, logits, moe_x = mtp.forward(tokens[1:], hidden[:-1], torch.arange(t - 1))
        chain_token = int(logits[-1].argmax())
        y2, logits2, moe_x2 = mtp.forward(torch.cat([tokens[1:], torch.tensor([chain_token])]),
                                          torch.cat([hidden[:-1], y[-1:]]), torch.arange(t))
        gap = min(mm.routing_gap(block.mlp, moe_x), mm.routing_gap(block.mlp, moe_x2))
        if gap >= mm.MIN_GAP:
            break
    else:
        sys.exit("no MTP seed gives clear routing")
    if target_gap < mm.MIN_GAP:
        sys.exit(f"the target's routing on the MTP sequence is a near-tie ({target_gap:.2e})")
    out = {k: v for k, v in tensors.items() if k.startswith(p)}
    bf16 = lambda x: x.detach().to(torch.bfloat16).contiguous().clone()  # noqa: E731
    out[p + "enorm.weight"] = bf16(mtp.enorm.weight)
    out[p + "hnorm.weight"] = bf16(mtp.hnorm.weight)
    out[p + "eh_proj.weight"] = bf16(mtp.eh_proj.weight)
    out[p + "shared_head.norm.weight"] = bf16(mtp.shared_norm.weight)
    out[p + "shared_head.head.weight"] = bf16(target.lm_head.weight)
    out[p + "embed_tokens.weight"] = bf16(target.model.embed_tokens.weight)
    record = {"tokens": tokens.tolist(), "target_hidden": rounded(hidden.tolist()),
              "mtp_hidden": rounded(y.tolist()), "mtp_logits": rounded(logits.tolist()),
              "chain_token": chain_token, "chain_logits": rounded(logits2[-1].tolist()),
              "min_routing_gap": gap, "target_min_routing_gap": target_gap, "seed": seed,
              "notes": f"MTP layer {n} of fp8_deepseek_v3 (weights seed {1000 + seed}, glue "
                       f"{2000 + seed}); reference: transformers' DeepseekV3DecoderLayer, eager, "
                       "f32, on the dequantized weights"}
    return out, record


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
        tensors, deq = quantize(state)
        save_file({k: v.contiguous() for k, v in deq.items()},
                  os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        target, logits, gaps, greedy = reference(tmp, prompts)
        mtp_tensors, mtp_record = mtp_layer(
            target, torch.tensor(prompts[MTP_PROMPT] + greedy[MTP_PROMPT]), tmp)
        tensors.update(mtp_tensors)
    cfg.num_nextn_predict_layers = 1
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
    mtp_record.update(versions=expected["versions"])
    with open(os.path.join(out, "expected_mtp.json"), "w") as f:
        json.dump(mtp_record, f)
        f.write("\n")
    print("MTP:", json.dumps({k: v for k, v in mtp_record.items() if not isinstance(v, list)}))
    print("gap / max|logit|:", [round(g / m, 4) for g, m in zip(gaps, maxabs)],
          "greedy:", greedy, flush=True)


if __name__ == "__main__":
    main()
