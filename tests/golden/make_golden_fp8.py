#!/usr/bin/env python3
"""Makes the FP8 golden fixtures (issue 38): one random bf16 tiny Llama written by our own small
writers in each FP8 checkpoint format, and what transformers computes with the same weights
dequantized (code * scale, in f32).

Formats (OUT/fp8/<name>/: config.json, generation_config.json, model.safetensors, expected.json):
  base_bf16           the bf16 model itself (for --quantization=fp8; its expected.json is the
                      per-channel quantization of these weights, dequantized)
  fp8_block           quant_method "fp8", weight_block_size [128, 128]: e4m3 weights with F32
                      weight_scale_inv per 128x128 block (partial blocks at the edges), dynamic
                      1x128 activations (DeepSeek / Qwen3-FP8 style)
  ct_channel_dynamic  compressed-tensors float-quantized: F32 weight_scale [n, 1] per channel,
                      dynamic per-token activations (llm-compressor's FP8_DYNAMIC)
  ct_tensor_static    compressed-tensors: weight_scale [1] per tensor, static input_scale [1]
                      calibrated on the prompts (llm-compressor's FP8 with calibration)
  modelopt            quant_method "modelopt", quant_algo FP8: scalar F32 weight_scale and
                      input_scale (TensorRT Model Optimizer's export)
expected.json holds two references: transformers on the dequantized weights alone
(last_prompt_logits, ...), and the same with every decoder Linear's input quantized as the scheme
says (forward pre-hooks: dynamic per-token, dynamic 1x128 groups, or the static input_scale;
last_prompt_logits_act_quant, ...), which is what the engine computes. Every format also gets
expected_lm_head.json: the same two references with --quantize_lm_head (lm_head per-channel too,
its input quantized per token in the second, whatever the format's scheme: the runtime's FP8
head is per-token; with base_bf16 that is --quantization=fp8 --quantize_lm_head).

  python3 tests/golden/make_golden_fp8.py --out DIR [--tar FILE.tar.gz] [--formats=a,b]

Needs PyTorch (float8_e4m3fn) and transformers; CPU only, one thread, deterministic.
"""

import argparse
import json
import math
import os
import random
import shutil
import tarfile

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, LlamaConfig

SEED = 38
FP8_MAX = 448.0
BLOCK = 128
# hidden 256 = two 128-blocks; head_dim 48: q rows 192, k/v rows 96 and o_proj / down_proj
# inputs 192, all partial blocks.
CONFIG = dict(vocab_size=256, hidden_size=256, intermediate_size=192, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=48,
              max_position_embeddings=512, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
              tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
PROMPT_LENGTHS = [1, 4, 9, 33, 64]
MAX_NEW_TOKENS = 4
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

CT_GROUP = {"targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False}}
QUANT_CONFIGS = {
    "fp8_block": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                  "weight_block_size": [BLOCK, BLOCK]},
    "ct_channel_dynamic": {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "quantization_status": "compressed", "ignore": ["lm_head"],
        "config_groups": {"group_0": {
            **CT_GROUP, "weights": {**CT_GROUP["weights"], "strategy": "channel"},
            "input_activations": {"num_bits": 8, "type": "float", "symmetric": True,
                                  "dynamic": True, "strategy": "token"}}}},
    "ct_tensor_static": {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "quantization_status": "compressed", "ignore": ["lm_head"],
        "config_groups": {"group_0": {
            **CT_GROUP, "weights": {**CT_GROUP["weights"], "strategy": "tensor"},
            "input_activations": {"num_bits": 8, "type": "float", "symmetric": True,
                                  "dynamic": False, "strategy": "tensor"}}}},
    "modelopt": {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": None,
                 "exclude_modules": ["lm_head"]},
}


def make_prompts():
    rng = random.Random(SEED)
    return [[rng.randrange(3, CONFIG["vocab_size"]) for _ in range(n)] for n in PROMPT_LENGTHS]


def random_bf16_model():
    cfg = LlamaConfig(**CONFIG)
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
            p.copy_(v.to(torch.bfloat16).float())  # bf16 values, kept in f32
    return cfg, model


def e4m3(x):
    """Saturating round-to-nearest-even cast (clamp first: torch's cast alone gives NaN)."""
    return x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def safe_scale(amax):
    return torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))


def quant_block(w):
    n, k = w.shape
    nb, kb = math.ceil(n / BLOCK), math.ceil(k / BLOCK)
    pad = torch.zeros(nb * BLOCK, kb * BLOCK)
    pad[:n, :k] = w
    blocks = pad.view(nb, BLOCK, kb, BLOCK)
    scale = safe_scale(blocks.abs().amax(dim=(1, 3)))
    codes = e4m3((blocks / scale[:, None, :, None]).reshape(nb * BLOCK, kb * BLOCK)[:n, :k])
    deq = (codes.float().reshape(n, k) *
           scale.repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k])
    return codes.contiguous(), scale, deq


def quant_channel(w):
    scale = safe_scale(w.abs().amax(dim=1, keepdim=True))  # [n, 1]
    codes = e4m3(w / scale)
    return codes, scale, codes.float() * scale


def quant_tensor(w):
    scale = safe_scale(w.abs().amax())
    codes = e4m3(w / scale)
    return codes, scale, codes.float() * scale


@torch.no_grad()
def calibrate_input_amax(model, prompts):
    """max |input| of every decoder Linear over the prompts (f32 model)."""
    amax, hooks = {}, []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name.split(".")[-1] in LINEARS:
            def hook(m, inp, out, name=name):
                amax[name] = max(amax.get(name, 0.0), float(inp[0].abs().max()))
            hooks.append(mod.register_forward_hook(hook))
    for p in prompts:
        model(torch.tensor([p]))
    for h in hooks:
        h.remove()
    return amax


def quantize_state(fmt, state, input_amax):
    """The checkpoint tensors of `fmt` and the dequantized f32 state dict."""
    out, deq = {}, {}
    for name, w in state.items():
        base = name[:-len("weight")]
        if name.split(".")[-2] not in LINEARS:
            out[name] = w.to(torch.bfloat16)
            deq[name] = w.to(torch.bfloat16).float()
            continue
        if fmt == "fp8_block":
            codes, scale, d = quant_block(w)
            out[base + "weight_scale_inv"] = scale.float()
        elif fmt in ("ct_channel_dynamic", "base_bf16"):
            codes, scale, d = quant_channel(w)
            out[base + "weight_scale"] = scale.float()
        elif fmt == "ct_tensor_static":
            codes, scale, d = quant_tensor(w)
            out[base + "weight_scale"] = scale.float().reshape(1)
        else:  # modelopt
            codes, scale, d = quant_tensor(w)
            out[base + "weight_scale"] = scale.float().reshape(())
        if fmt in ("ct_tensor_static", "modelopt"):
            s = torch.tensor(max(input_amax[name[:-len(".weight")]], 1e-12) / FP8_MAX)
            out[base + "input_scale"] = s.float().reshape(1 if fmt != "modelopt" else ())
        out[name] = codes
        deq[name] = d
    if fmt == "base_bf16":  # the model itself; the reference is its online quantization
        out = {k: v.to(torch.bfloat16) for k, v in state.items()}
    return out, deq


# Activation schemes as the checkpoints say (the engine's kernels/fp8 semantics, written anew).
ACTIVATION = {"base_bf16": "token", "fp8_block": "group128", "ct_channel_dynamic": "token",
              "ct_tensor_static": "static", "modelopt": "static"}


def fake_quant(x, scheme, static_scale=None):
    """x quantized to e4m3 as `scheme` says, then dequantized (f32)."""
    if scheme == "static":
        return e4m3(x / static_scale).float() * static_scale
    if scheme == "token":
        scale = safe_scale(x.abs().amax(dim=-1, keepdim=True))
        return e4m3(x / scale).float() * scale
    parts = []  # group128: per token and group of 128 columns (the last one may be partial)
    for g in range(0, x.shape[-1], BLOCK):
        part = x[..., g:g + BLOCK]
        scale = safe_scale(part.abs().amax(dim=-1, keepdim=True))
        parts.append(e4m3(part / scale).float() * scale)
    return torch.cat(parts, dim=-1)


def add_activation_quant(model, fmt, tensors, lm_head=False):
    quantized = LINEARS + (("lm_head",) if lm_head else ())
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name.split(".")[-1] in quantized:
            s = tensors.get(name + ".input_scale")
            scheme = "token" if name == "lm_head" else ACTIVATION[fmt]
            def hook(m, inp, s=None if s is None else float(s.reshape(())), scheme=scheme):
                return (fake_quant(inp[0], scheme, s),)
            mod.register_forward_pre_hook(hook)


@torch.no_grad()
def reference(cfg, deq_state, prompts, fmt=None, tensors=None, lm_head=False):
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    model.load_state_dict(deq_state, strict=True)
    if fmt is not None:
        add_activation_quant(model, fmt, tensors, lm_head)
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


def write_dir(path, cfg, tensors, quant_config, expected):
    os.makedirs(path, exist_ok=True)
    cfg.save_pretrained(path)
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    config["dtype"] = "bfloat16"
    if quant_config is not None:
        config["quantization_config"] = quant_config
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    save_file({k: v.contiguous() for k, v in tensors.items()},
              os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "expected.json"), "w") as f:
        json.dump(expected, f)
        f.write("\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--tar")
    # The CUDA attention kernels take head_dim 16/32/64/128/256: tests/gpu/fp8_cuda_golden.sh
    # writes the formats again with --head_dim=64 on the GPU machine (not the CI fixtures).
    parser.add_argument("--head_dim", type=int, default=CONFIG["head_dim"])
    parser.add_argument("--formats", default="",
                        help="comma-separated subset of the formats (default: all)")
    args = parser.parse_args()
    CONFIG["head_dim"] = args.head_dim
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    cfg, model = random_bf16_model()
    prompts = make_prompts()
    state = {k: v.float().clone() for k, v in model.state_dict().items()}
    input_amax = calibrate_input_amax(model, prompts)
    root = os.path.join(args.out, "fp8")
    shutil.rmtree(root, ignore_errors=True)
    summary = {}
    formats = ["base_bf16"] + list(QUANT_CONFIGS)
    if args.formats:
        formats = [f for f in formats if f in args.formats.split(",")]
    for fmt in formats:
        tensors, deq = quantize_state(fmt, state, input_amax)
        logits, gaps, greedy = reference(cfg, deq, prompts)
        aq_logits, aq_gaps, aq_greedy = reference(cfg, deq, prompts, fmt, tensors)
        maxabs = [max(abs(x) for x in row) for row in logits]
        expected = {"format": fmt, "prompts": prompts, "last_prompt_logits": logits,
                    "top2_gap": gaps, "greedy_tokens": greedy, "max_new_tokens": MAX_NEW_TOKENS,
                    "last_prompt_logits_act_quant": aq_logits, "top2_gap_act_quant": aq_gaps,
                    "greedy_tokens_act_quant": aq_greedy,
                    "reference": "transformers f32 on the dequantized weights" +
                                 (" of --quantization=fp8 (per-channel)" if fmt == "base_bf16"
                                  else "")}
        write_dir(os.path.join(root, fmt), cfg, tensors, QUANT_CONFIGS.get(fmt), expected)
        # --quantize_lm_head: the head per-channel too, its input per token
        deq_head = dict(deq)
        deq_head["lm_head.weight"] = quant_channel(state["lm_head.weight"])[2]
        h_logits, h_gaps, h_greedy = reference(cfg, deq_head, prompts)
        h_aq_logits, h_aq_gaps, h_aq_greedy = reference(cfg, deq_head, prompts, fmt, tensors,
                                                        lm_head=True)
        with open(os.path.join(root, fmt, "expected_lm_head.json"), "w") as f:
            json.dump({**expected, "last_prompt_logits": h_logits, "top2_gap": h_gaps,
                       "greedy_tokens": h_greedy, "last_prompt_logits_act_quant": h_aq_logits,
                       "top2_gap_act_quant": h_aq_gaps, "greedy_tokens_act_quant": h_aq_greedy,
                       "reference": "transformers f32 on the dequantized weights" +
                                    (" of --quantization=fp8" if fmt == "base_bf16" else "") +
                                    " --quantize_lm_head (lm_head per-channel, its input "
                                    "per token)"}, f)
            f.write("\n")
        cos = [float(torch.nn.functional.cosine_similarity(torch.tensor(a), torch.tensor(b), 0))
               for a, b in zip(logits, aq_logits)]
        summary[fmt] = {"min_gap_over_max": min(g / m for g, m in zip(gaps, maxabs)),
                        "greedy_first": [g[0] for g in greedy],
                        "greedy_first_act_quant": [g[0] for g in aq_greedy],
                        "cosine_act_quant_vs_dequantized": cos}
        print(fmt, summary[fmt], flush=True)
    summary["versions"] = {"torch": torch.__version__,
                           "transformers": __import__("transformers").__version__}
    with open(os.path.join(root, "summary_fp8.json"), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    if args.tar:
        with tarfile.open(args.tar, "w:gz") as tar:
            tar.add(root, arcname="fp8")


if __name__ == "__main__":
    main()
