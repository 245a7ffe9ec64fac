#!/usr/bin/env python3
"""Makes the compressed-tensors FP8 MoE golden fixtures (issue 38): a random bf16 tiny Qwen3-MoE
quantized as llm-compressor's FP8_DYNAMIC scheme writes it (every decoder Linear, routed experts
included, e4m3 with a per-channel weight_scale [n, 1]; dynamic per-token activations; the MoE
router mlp.gate and lm_head left bf16 through the `ignore` list), and what transformers computes
in f32 with the same weights dequantized (code * scale); and another one in llm-compressor's
FP8_BLOCK form (ct_moe_block_dynamic, below).

  OUT/ct_moe_channel_dynamic/      our writer (F32 scales; ignore ["lm_head", "re:.*mlp.gate$"],
                                   the recipe's form)
  OUT/ct_moe_channel_dynamic_pkg/  the real compressed-tensors package (when it imports): its
                                   apply_quantization_config + calculate_qparams (the scale
                                   llm-compressor's min-max observer computes) + ModelCompressor
                                   (compress_model, update_config) on nn.Linear modules under the
                                   checkpoint's names; its config lists every ignored module by
                                   name, as llm-compressor saves it
  OUT/ct_moe_block_dynamic/        FP8_BLOCK (BLOCK_CONFIG: 128-blocks in every projection, a
                                   partial edge block in the experts and k/v; our writer, bf16
                                   scales [ceil(n/128), ceil(k/128)] as the package writes them;
                                   with the package installed its output is checked byte for byte
                                   against ours and its quantization_config against BLOCK_QUANT);
                                   activations dynamic per token and group of 128 (*_act_quant);
                                   no TP=2 references (TP=2 cuts its 128-blocks)
each with config.json, generation_config.json, model.safetensors, expected.json: transformers 5
in f32 on that directory's dequantized weights (last_prompt_logits, top2_gap, greedy_tokens), and
the same with every FP8 Linear's input quantized per token as the scheme says (*_act_quant;
*_act_quant_tp2_ep / *_act_quant_tp2: as a TP=2 rank with / without expert parallelism does, the
row-parallel inputs quantized per token over each rank's half):
forward pre-hooks on the attention / dense-MLP nn.Linear modules, and inside the fused experts
(Qwen3MoeExperts, which call nn.functional.linear per expert) that function wrapped for the
duration of their forward; the router's input is left as it is, as the engine leaves it.

  python3 tests/golden/make_golden_ct_moe.py --out DIR [--only channel|block]

Needs PyTorch (float8_e4m3fn) and transformers (compressed-tensors optional); CPU only, one
thread, deterministic.
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
from transformers import AutoModelForCausalLM, Qwen3MoeConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden_fp8 as f8  # noqa: E402

SEED = 39
# 8 experts of width 64, top 2; layer 1 dense (mlp_only_layers) so both MLP kinds are covered;
# head_dim 32, GQA 4 / 2 with Qwen3's q/k norms.
CONFIG = dict(vocab_size=256, hidden_size=128, intermediate_size=192, moe_intermediate_size=64,
              num_hidden_layers=3, mlp_only_layers=[1], decoder_sparse_step=1,
              num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=8,
              num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=512,
              rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
PROMPT_LENGTHS = [1, 4, 9, 17, 33]
MAX_NEW_TOKENS = 4
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
QUANT = {"quant_method": "compressed-tensors", "format": "float-quantized",
         "quantization_status": "compressed", "ignore": ["lm_head", "re:.*mlp.gate$"],
         "config_groups": {"group_0": {
             "targets": ["Linear"],
             "weights": {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False,
                         "strategy": "channel"},
             "input_activations": {"num_bits": 8, "type": "float", "symmetric": True,
                                   "dynamic": True, "strategy": "token"}}}}
# FP8_BLOCK: hidden 128 (one k-block for q/k/v, gate/up and the dense down), experts of width 160
# (gate / up rows: a full 128-row block and a partial one of 32; down: a full 128-column block and
# a partial one of 32 — compressed-tensors pads the weight to whole blocks and warns that vLLM
# wants k divisible by 128; its group-of-128 activation QDQ would refuse it, the engine and
# fake_quant take the last group partial), k/v rows 64 (a partial block), q / o 128 (full), one
# MoE layer (4 experts, top 2) and one dense (intermediate 128). vocab 128 keeps it ~0.45 MB.
BLOCK_CONFIG = dict(CONFIG, vocab_size=128, moe_intermediate_size=160, intermediate_size=128,
                    num_hidden_layers=2, mlp_only_layers=[1], num_experts=4)
BLOCK_QUANT = {"quant_method": "compressed-tensors", "format": "float-quantized",
               "quantization_status": "compressed", "ignore": ["lm_head", "re:.*mlp.gate$"],
               "config_groups": {"group_0": {
                   "targets": ["Linear"],
                   "weights": {"num_bits": 8, "type": "float", "symmetric": True,
                               "dynamic": False, "strategy": "block",
                               "block_structure": [f8.BLOCK, f8.BLOCK]},
                   "input_activations": {"num_bits": 8, "type": "float", "symmetric": True,
                                         "dynamic": True, "strategy": "group",
                                         "group_size": f8.BLOCK}}}}
# Per fixture kind: config, our writer's quantizer, the package's preset, the activation scheme
# (make_golden_fp8.fake_quant's name), the TP=2 references recorded.
KINDS = {
    "channel": dict(config=CONFIG, quant=QUANT, preset="FP8_DYNAMIC", act="token",
                    tp_forms=("_tp2_ep", "_tp2")),
    "block": dict(config=BLOCK_CONFIG, quant=BLOCK_QUANT, preset="FP8_BLOCK", act="group128",
                  tp_forms=()),
}


def random_state(config):
    """The hub-layout state dict (per-expert names) of a random Qwen3-MoE, bf16 values."""
    cfg = Qwen3MoeConfig(**config)
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
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        state = load_file(os.path.join(tmp, "model.safetensors"))
    assert any(".mlp.experts.0.gate_proj.weight" in k for k in state), "not the per-expert layout"
    return cfg, {k: v.to(torch.bfloat16) for k, v in state.items()}


def is_linear(name):
    return name.endswith(".weight") and name.split(".")[-2] in LINEARS


def block_view(w):
    """w [n, k] in f32, zero-padded to whole 128-blocks: [ceil(n/128), 128, ceil(k/128), 128]."""
    n, k = w.shape
    pad = torch.zeros(-(-n // f8.BLOCK) * f8.BLOCK, -(-k // f8.BLOCK) * f8.BLOCK)
    pad[:n, :k] = w.float()
    return pad.view(pad.shape[0] // f8.BLOCK, f8.BLOCK, pad.shape[1] // f8.BLOCK, f8.BLOCK)


def quant_block_bf16(w):
    """128 x 128 blocks of the bf16 weight w as compressed-tensors writes them: bf16 scales
    max|block| / 448 (the weight's dtype), codes of w / scale divided in bf16 (last blocks
    partial)."""
    n, k = w.shape
    scale = f8.safe_scale(block_view(w).abs().amax(dim=(1, 3))).to(torch.bfloat16)
    full = scale.repeat_interleave(f8.BLOCK, 0).repeat_interleave(f8.BLOCK, 1)
    return f8.e4m3((w / full[:n, :k]).float()), scale


def our_writer(state, kind="channel"):
    tensors = {}
    for name, w in state.items():
        if not is_linear(name):
            tensors[name] = w
            continue
        if kind == "block":
            codes, scale = quant_block_bf16(w)
        else:
            codes, scale, _ = f8.quant_channel(w.float())
            scale = scale.float()
        tensors[name] = codes
        tensors[name[:-len("weight")] + "weight_scale"] = scale
    return tensors, KINDS[kind]["quant"]


def package_writer(state, kind="channel"):
    """The same weights through the real compressed-tensors package."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationConfig, apply_quantization_config,
                                                 preset_name_to_scheme)
    from compressed_tensors.quantization.utils import calculate_qparams

    root = torch.nn.Module()  # nn.Linear modules under the checkpoint's names (gate included)
    for name, w in state.items():
        if not name.endswith(".weight") or w.dim() != 2 or "embed_tokens" in name:
            continue
        *path, leaf = name[:-len(".weight")].split(".")
        parent = root
        for part in path:
            if not hasattr(parent, part):
                parent.add_module(part, torch.nn.Module())
            parent = getattr(parent, part)
        linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=torch.bfloat16)
        linear.weight.data.copy_(w)
        parent.add_module(leaf, linear)
    qconfig = QuantizationConfig(
        config_groups={"group_0": preset_name_to_scheme(KINDS[kind]["preset"], ["Linear"])},
        ignore=["lm_head", "re:.*mlp.gate$"])
    apply_quantization_config(root, qconfig)
    with torch.no_grad():
        for _, mod in root.named_modules():
            scheme = getattr(mod, "quantization_scheme", None)
            if scheme is None:
                continue
            w = mod.weight.float()  # min-max per output channel / block, as llm-compressor
            if kind == "block":  # observes it (zero padding: calculate_qparams includes 0)
                lo, hi = block_view(w).amin(dim=(1, 3)), block_view(w).amax(dim=(1, 3))
            else:
                lo, hi = w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
            scale, _ = calculate_qparams(lo, hi, scheme.weights)
            mod.weight_scale.data.copy_(scale.to(mod.weight_scale.dtype))
    compressor = ModelCompressor.from_pretrained_model(root, quantization_format="float-quantized")
    compressor.compress_model(root)
    tensors = dict(state)
    for name, t in root.state_dict().items():
        tensors[name] = t.detach().clone()
    with tempfile.TemporaryDirectory() as tmp:
        compressor.update_config(tmp)
        with open(os.path.join(tmp, "config.json")) as f:
            quant = json.load(f)["quantization_config"]
    return tensors, quant


def dequantized(tensors):
    deq = {}
    for name, t in tensors.items():
        if name.endswith("weight_scale") or name.endswith("zero_point"):
            continue
        if t.dtype == torch.float8_e4m3fn:
            scale = tensors[name[:-len("weight")] + "weight_scale"].float()
            if scale.dim() == 2 and scale.shape[0] != t.shape[0]:  # [ceil(n/128), ceil(k/128)]
                scale = scale.repeat_interleave(f8.BLOCK, 0).repeat_interleave(f8.BLOCK, 1)
                scale = scale[:t.shape[0], :t.shape[1]]
            deq[name] = t.float() * scale
        else:
            deq[name] = t.float()
    return deq


# The row-parallel inputs a rank of a TP=2 group quantizes over its half (as vLLM's
# RowParallelLinear does): o_proj's and the dense down_proj's always; the experts' down_proj's
# only without expert parallelism (EP keeps experts whole).
TP_FORMS = {"": (False, False), "_tp2_ep": (True, False), "_tp2": (True, True)}


def add_token_quant(model, act="token", halves_rows=False, halves_experts=False):
    """Quantizes every FP8 Linear's input per token (e4m3, dynamic; `act` "group128": per token
    and group of 128), as the engine does; with `halves_rows` / `halves_experts` the row-parallel
    inputs per token and half. Returns the count of expert GEMMs quantized (a list of one int,
    filled as the model runs)."""
    expert_calls = [0]
    inter = model.config.moe_intermediate_size

    def quant(x, halves=False):
        if not halves:
            return f8.fake_quant(x, act)
        return torch.cat([f8.fake_quant(p, act) for p in x.chunk(2, dim=-1)], dim=-1)

    for name, mod in model.named_modules():
        leaf = name.split(".")[-1]
        if isinstance(mod, torch.nn.Linear) and leaf in LINEARS:
            halves = halves_rows and leaf in ("o_proj", "down_proj")
            mod.register_forward_pre_hook(
                lambda m, args, halves=halves: (quant(args[0], halves),) + args[1:])
        elif type(mod).__name__ == "Qwen3MoeExperts":
            plain = torch.nn.functional.linear

            def quantized(x, w, b=None, plain=plain):
                expert_calls[0] += 1  # down_proj's input is [tokens, inter]
                return plain(quant(x, halves_experts and x.shape[-1] == inter), w, b)

            def enter(m, args, quantized=quantized):
                torch.nn.functional.linear = quantized

            def leave(m, args, out, plain=plain):
                torch.nn.functional.linear = plain

            mod.register_forward_pre_hook(enter)
            mod.register_forward_hook(leave)
    return expert_calls


@torch.no_grad()
def reference(config, deq, prompts, act=None, tp_form=""):
    """transformers in f32 on `deq`; `act`: every FP8 Linear's input quantized so."""
    with tempfile.TemporaryDirectory() as tmp:
        Qwen3MoeConfig(**config).save_pretrained(tmp)
        save_file({k: v.contiguous() for k, v in deq.items()},
                  os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        # Eager experts: the per-expert loop of nn.functional.linear calls add_token_quant wraps
        # (the default may be a grouped GEMM that bypasses it).
        model, info = AutoModelForCausalLM.from_pretrained(
            tmp, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager",
            output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        sys.exit(f"transformers did not load the dequantized weights exactly: {bad}")
    model.eval()
    expert_calls = add_token_quant(model, act, *TP_FORMS[tp_form]) if act else [0]
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
    if act and expert_calls[0] == 0:
        sys.exit("the experts' inputs were not quantized (no nn.functional.linear call seen)")
    return logits, gaps, greedy


def write(out, tensors, quant, prompts, label, kind="channel"):
    config, act = KINDS[kind]["config"], KINDS[kind]["act"]
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    Qwen3MoeConfig(**config).save_pretrained(out)
    with open(os.path.join(out, "config.json")) as f:
        saved = json.load(f)
    saved["dtype"] = "bfloat16"
    saved["quantization_config"] = quant
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(saved, f, indent=2, sort_keys=True)
        f.write("\n")
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())},
              os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    logits, gaps, greedy = reference(config, dequantized(tensors), prompts)
    aq_logits, aq_gaps, aq_greedy = reference(config, dequantized(tensors), prompts, act)
    tp = {}  # the TP=2 forms' references (ct_moe_tp_golden_test.sh)
    for form in KINDS[kind]["tp_forms"]:
        lg, gp, gr = reference(config, dequantized(tensors), prompts, act, tp_form=form)
        tp.update({"last_prompt_logits_act_quant" + form: lg, "top2_gap_act_quant" + form: gp,
                   "greedy_tokens_act_quant" + form: gr})
    expected = {"format": label, "prompts": prompts, "last_prompt_logits": logits,
                "top2_gap": gaps, "greedy_tokens": greedy, "max_new_tokens": MAX_NEW_TOKENS,
                "last_prompt_logits_act_quant": aq_logits, "top2_gap_act_quant": aq_gaps,
                "greedy_tokens_act_quant": aq_greedy, **tp,
                "reference": "transformers f32 on the dequantized weights",
                "versions": {"torch": torch.__version__,
                             "transformers": __import__("transformers").__version__}}
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f)
        f.write("\n")
    maxabs = [max(abs(x) for x in row) for row in logits]
    cos = [round(float(torch.nn.functional.cosine_similarity(
        torch.tensor(a), torch.tensor(b), 0)), 6) for a, b in zip(logits, aq_logits)]
    print(label, "gap / max|logit|:", [round(g / m, 4) for g, m in zip(gaps, maxabs)],
          "greedy:", greedy, "act-quant gap / max:",
          [round(g / max(abs(x) for x in r), 4) for g, r in zip(aq_gaps, aq_logits)],
          "cosine act-quant vs weights alone:", cos, flush=True)


def same_as_package(tensors, quant, pkg, pkg_quant):
    """Exits unless the package wrote our e4m3 codes and scales bit for bit and the same
    quantization_config (the fields the loader reads)."""
    fp8 = [k for k, t in tensors.items() if t.dtype == torch.float8_e4m3fn]
    scales = [k[:-len("weight")] + "weight_scale" for k in fp8]
    differ = [k for k in fp8 + scales if k not in pkg or tensors[k].dtype != pkg[k].dtype or
              not torch.equal(tensors[k].view(torch.uint8), pkg[k].view(torch.uint8))]
    ours, theirs = (next(iter(q["config_groups"].values())) for q in (quant, pkg_quant))
    fields = [(part, key) for part in ("weights", "input_activations") for key in ours[part]
              if ours[part][key] != theirs[part][key]]
    print(f"  the package: {len(fp8) + len(scales) - len(differ)} of {len(fp8) + len(scales)} "
          f"tensors ({len(fp8)} e4m3 + their scales) equal to ours bit for bit; config fields "
          f"differing: {fields}", flush=True)
    if differ or fields or pkg_quant["format"] != quant["format"]:
        sys.exit(f"our writer differs from compressed-tensors: {differ[:5]} {fields}")


def make(kind, out):
    torch.manual_seed(SEED)
    config = KINDS[kind]["config"]
    _, state = random_state(config)
    rng = random.Random(SEED)
    prompts = [[rng.randrange(3, config["vocab_size"]) for _ in range(n)] for n in PROMPT_LENGTHS]
    tensors, quant = our_writer(state, kind)
    name = f"ct_moe_{kind}_dynamic"
    write(os.path.join(out, name), tensors, quant, prompts, "ours", kind)
    try:
        import compressed_tensors
    except ImportError:
        print("compressed-tensors is not installed: only our writer's fixture written")
        return
    pkg, pkg_quant = package_writer(state, kind)
    if kind == "block":  # ours is the package's output: one fixture
        same_as_package(tensors, quant, pkg, pkg_quant)
        return
    same = [k for k in tensors if k in pkg and tensors[k].dtype == torch.float8_e4m3fn and
            torch.equal(tensors[k].view(torch.uint8), pkg[k].view(torch.uint8))]
    print(f"compressed-tensors {compressed_tensors.__version__}: {len(same)} of "
          f"{sum(t.dtype == torch.float8_e4m3fn for t in tensors.values())} e4m3 tensors equal "
          "to our writer's byte for byte", flush=True)
    write(os.path.join(out, name + "_pkg"), pkg, pkg_quant, prompts,
          f"compressed-tensors {compressed_tensors.__version__}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", choices=sorted(KINDS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    for kind in [args.only] if args.only else KINDS:
        make(kind, args.out)


if __name__ == "__main__":
    main()
