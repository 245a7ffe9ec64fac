#!/usr/bin/env python3
"""Golden fixtures for whole DeepSeek-V2 / V3 models with mixture-of-experts layers (MLA attention
from make_golden_mla.py, layer 0 dense, layer 1 DeepSeek's MoE layer with shared experts).

Same expected.json as make_golden.py, written to OUT/<name>/ beside config.json and a checkpoint
in the hub's per-expert layout (mlp.gate.weight, V3's mlp.gate.e_score_correction_bias,
mlp.experts.{e}.gate_proj/up_proj/down_proj, mlp.shared_experts.*; make_golden_moe.save_hub).
Checks: transformers loads the written checkpoint back to the very model (logits bit-equal, no
missing / unexpected keys); every routing decision of every prompt token and greedy continuation
is clear (k-th vs (k+1)-th expert choice and kept vs first dropped group differ by >= MIN_GAP, from
the router logits transformers computed); the seed (first of SEEDS) also gives every greedy step a
top1-top2 gap >= 1.1e-3 of max|logit|.

  python3 tests/golden/make_golden_deepseek_moe.py --out DIR
"""

import argparse
import json
import math
import os
import shutil
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, DeepseekV2Config, DeepseekV3Config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden as mg  # noqa: E402
import make_golden_mla as mla  # noqa: E402
import make_golden_moe as moe  # noqa: E402

SEEDS = range(1, 31)
MIN_GAP = 1e-4
MIN_REL_GREEDY_GAP = 1.1e-3
MOE = dict(mla.MLA, first_k_dense_replace=1, n_routed_experts=8, moe_intermediate_size=24,
           q_lora_rank=24, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})

VARIANTS = [
    ("deepseek_v3_moe_f32", DeepseekV3Config,
     dict(MOE, rope_interleave=True, n_group=4, topk_group=2, num_experts_per_tok=2,
          norm_topk_prob=True, routed_scaling_factor=2.5, n_shared_experts=1),
     "DeepseekV3ForCausalLM: MLA (q_lora 24), layer 0 dense, layer 1 MoE: 8 experts of width 24 in "
     "4 groups, topk_group 2, top-2, sigmoid + e_score_correction_bias (random), normalised, x2.5, "
     "1 shared expert."),
    ("deepseek_v2_moe_f32", DeepseekV2Config,
     dict(MOE, topk_method="group_limited_greedy", n_group=4, topk_group=2, num_experts_per_tok=3,
          routed_scaling_factor=1.5, n_shared_experts=2),
     "DeepseekV2ForCausalLM: MLA (q_lora 24), layer 0 dense, layer 1 MoE: 8 experts of width 24, "
     "group_limited_greedy (4 groups, topk_group 2), top-3 softmax, x1.5, 2 shared experts."),
]


def routing_gaps(logits, bias, v3, n_group, topk_group, top_k):
    """Smallest k-th vs (k+1)-th choice gap and kept vs dropped group gap over the tokens."""
    logits = logits.double().reshape(-1, logits.shape[-1])
    scores = torch.sigmoid(logits) if v3 else torch.softmax(logits, dim=-1)
    choice = scores + bias.double() if bias is not None else scores
    n = choice.shape[-1]
    group_gap = math.inf
    if n_group > 1:
        g = choice.view(-1, n_group, n // n_group)
        gs = g.topk(2, dim=-1)[0].sum(-1) if v3 else g.max(-1).values
        top = gs.topk(topk_group + 1, dim=-1)
        group_gap = float((top.values[:, topk_group - 1] - top.values[:, topk_group]).min())
        mask = torch.zeros_like(gs).scatter_(1, top.indices[:, :topk_group], 1.0)
        choice = choice.masked_fill(~mask.repeat_interleave(n // n_group, dim=1).bool(),
                                    float("-inf") if v3 else 0.0)
    top = choice.topk(top_k + 1, dim=-1).values
    return float((top[:, top_k - 1] - top[:, top_k]).min()), group_gap


def try_seed(out_dir, name, cls, kwargs, seed, prompts):
    path = os.path.join(out_dir, name)
    shutil.rmtree(path, ignore_errors=True)
    model = AutoModelForCausalLM.from_config(cls(**kwargs), attn_implementation="eager").eval()
    mg.randomize(model, seed)
    gen = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for bname, b in model.named_buffers():
            if bname.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))
    model.config.dtype = torch.float32
    cfg = moe.save_hub(model, path)
    loaded, info = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    loaded.eval()
    problems = [f"loading: {k} {v}" for k, v in info.items()
                if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")]
    v3 = cfg["model_type"] == "deepseek_v3"
    captured = []
    hooks = []
    for layer in loaded.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and hasattr(gate, "weight") and gate.weight.shape[0] == kwargs[
                "n_routed_experts"]:
            bias = getattr(gate, "e_score_correction_bias", None)
            hooks.append(gate.register_forward_hook(
                lambda m, i, o, bias=bias: captured.append(
                    (o[0] if isinstance(o, tuple) else o, bias))))
    rec = {"variant": name, "dtype": "float32", "transformers_version": transformers.__version__,
           "torch_version": torch.__version__, "prompts": prompts,
           "prefix_pair": {"indices": [8, 9], "shared_prefix_len": mg.PREFIX_LEN},
           "max_new_tokens": mg.MAX_NEW_TOKENS, "last_prompt_logits": [], "greedy_tokens": [],
           "greedy_top2_gaps": []}
    stats = {"mem_max_rel": 0.0, "min_rel_gap": math.inf, "expert_gap": math.inf,
             "group_gap": math.inf}
    for ids in prompts:
        lg = mg.last_logits(loaded, ids)
        scale = float(lg.abs().max())
        stats["mem_max_rel"] = max(stats["mem_max_rel"],
                                   float((lg - mg.last_logits(model, ids)).abs().max()) / scale)
        toks, gaps = mg.greedy(loaded, ids)
        stats["min_rel_gap"] = min(stats["min_rel_gap"], min(gaps) / scale)
        captured.clear()
        mg.last_logits(loaded, ids + toks)  # one causal pass: every token's routing
        for logits, bias in captured:
            e, g = routing_gaps(logits, bias if v3 else None, v3, kwargs["n_group"],
                                kwargs["topk_group"], kwargs["num_experts_per_tok"])
            stats["expert_gap"] = min(stats["expert_gap"], e)
            stats["group_gap"] = min(stats["group_gap"], g)
        rec["last_prompt_logits"].append(mg.f32_list(lg))
        rec["greedy_tokens"].append(toks)
        rec["greedy_top2_gaps"].append([round(g, 6) for g in gaps])
    for h in hooks:
        h.remove()
    if not captured and not problems:
        problems.append("no router output captured")
    if stats["mem_max_rel"] != 0.0:
        problems.append(f"reloaded checkpoint differs: {stats['mem_max_rel']}")
    if min(stats["expert_gap"], stats["group_gap"]) < MIN_GAP:
        problems.append(f"routing gap {stats['expert_gap']:.2e} / {stats['group_gap']:.2e}")
    if stats["min_rel_gap"] < MIN_REL_GREEDY_GAP:
        problems.append(f"greedy gap {stats['min_rel_gap']:.2e}")
    return rec, stats, problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(mg.SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    os.makedirs(args.out, exist_ok=True)
    prompts = mg.make_prompts()
    failed = False
    for name, cls, kwargs, notes in VARIANTS:
        for seed in SEEDS:
            rec, stats, problems = try_seed(args.out, name, cls, kwargs, seed, prompts)
            print(f"  {name} seed {seed}: {stats} {problems}", flush=True)
            if not problems:
                break
        if problems:
            failed = True
            continue
        rec["notes"] = notes + (
            f" Weight seed {seed} (make_golden.randomize; bias N(0, 0.1)). Routing clear by "
            f"{min(stats['expert_gap'], stats['group_gap']):.2e}; checkpoint in the hub's "
            "per-expert layout. Reference: transformers eager attention on the CPU, batch 1, f32.")
        with open(os.path.join(args.out, name, "expected.json"), "w") as f:
            json.dump(rec, f, separators=(",", ":"))
            f.write("\n")
        print(json.dumps({"variant": name, "seed": seed, **{k: f"{v:.3e}" for k, v in
                                                           stats.items()}}), flush=True)
    print("make_golden_deepseek_moe:", "FAILED" if failed else "OK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
