#!/usr/bin/env python3
"""Layer-level fixtures for DeepSeek's MoE layer: transformers' DeepseekV3MoE / DeepseekV2Moe on
random inputs, every routing variant (V3 noaux_tc: sigmoid + e_score_correction_bias + top-2-sum
group scores, normalised or not, scaled; V2 greedy and group_limited_greedy: softmax, max group
scores, scaled, norm_topk_prob ignored).

Each variant becomes OUT/<name>.safetensors (f32): x [T, H], y [T, H] = the layer's output
(routed experts + shared experts), router [E, H], bias [E] (V3), experts_gate_up [E, 2I, H] (per
expert its gate rows, then its up rows), experts_down [E, H, I], shared_gate_up [2Is, H],
shared_down [H, Is]; the routing parameters in the metadata. An fp64 re-implementation of the
routing written here must reproduce transformers' fp64 output to 1e-6 (its router logits are f32
even then; so the reference reads the weights as the C++ side does), and every decision is clear: the k-th and (k+1)-th expert choice scores and the kept
and first dropped group scores differ by >= MIN_GAP for every token (the seed is the first of
1..60 for which they do).

  python3 tests/golden/make_deepseek_moe_layer.py --out DIR
"""

import argparse
import importlib
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file

T, H, E, I, GROUPS = 24, 32, 16, 12, 4
MIN_GAP = 1e-4

# name -> (version, topk_method, n_group, topk_group, top_k, norm_topk_prob, scaling, n_shared)
VARIANTS = {
    "v3_noaux_tc_grouped_norm": (3, "noaux_tc", GROUPS, 2, 4, True, 2.5, 1),
    "v3_noaux_tc_ungrouped": (3, "noaux_tc", 1, 1, 3, False, 1.0, 2),
    "v2_greedy": (2, "greedy", 1, 1, 4, True, 2.0, 2),  # V2 ignores norm_topk_prob
    "v2_group_limited_greedy": (2, "group_limited_greedy", GROUPS, 2, 4, False, 1.5, 1),
}


def moe_class(module):
    """DeepseekV3MoE / DeepseekV2Moe (spelled either way)."""
    for name in dir(module):
        obj = getattr(module, name)
        if isinstance(obj, type) and name.lower() in ("deepseekv2moe", "deepseekv3moe"):
            return obj
    raise RuntimeError(f"no MoE class in {module.__name__}")


def build(version, method, n_group, topk_group, top_k, norm, scaling, n_shared):
    kw = dict(hidden_size=H, intermediate_size=64, moe_intermediate_size=I, n_routed_experts=E,
              n_shared_experts=n_shared, num_experts_per_tok=top_k, n_group=n_group,
              topk_group=topk_group, norm_topk_prob=norm, routed_scaling_factor=scaling,
              num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4, vocab_size=64)
    if version == 2:
        kw["topk_method"] = method
    cfg = getattr(transformers, f"DeepseekV{version}Config")(**kw)
    module = importlib.import_module(
        f"transformers.models.deepseek_v{version}.modeling_deepseek_v{version}")
    return moe_class(module)(cfg).eval()


def tensors_of(layer):
    """Hub-style stacked tensors, whatever layout transformers keeps the experts in."""
    sd = {k: v.detach().float().clone() for k, v in layer.state_dict().items()}
    out = {"router": sd["gate.weight"]}
    if "gate.e_score_correction_bias" in sd:
        out["bias"] = sd["gate.e_score_correction_bias"]
    if "experts.gate_up_proj" in sd:
        gu, down = sd["experts.gate_up_proj"], sd["experts.down_proj"]
        if tuple(gu.shape[1:]) == (H, 2 * I):
            gu = gu.transpose(1, 2)
        if tuple(down.shape[1:]) == (I, H):
            down = down.transpose(1, 2)
    else:
        gu = torch.stack([torch.cat([sd[f"experts.{e}.gate_proj.weight"],
                                     sd[f"experts.{e}.up_proj.weight"]]) for e in range(E)])
        down = torch.stack([sd[f"experts.{e}.down_proj.weight"] for e in range(E)])
    assert tuple(gu.shape) == (E, 2 * I, H) and tuple(down.shape) == (E, H, I), (gu.shape, down.shape)
    out["experts_gate_up"], out["experts_down"] = gu.contiguous(), down.contiguous()
    out["shared_gate_up"] = torch.cat([sd["shared_experts.gate_proj.weight"],
                                       sd["shared_experts.up_proj.weight"]]).contiguous()
    out["shared_down"] = sd["shared_experts.down_proj.weight"].contiguous()
    return out


def reference(t, x, version, n_group, topk_group, top_k, norm, scaling):
    """fp64 routing + experts from the stacked tensors; returns (y, min expert gap, min group gap)."""
    w = {k: v.double() for k, v in t.items()}
    x = x.double()
    logits = x @ w["router"].T
    scores = torch.sigmoid(logits) if version == 3 else torch.softmax(logits, dim=-1)
    choice = scores + w["bias"] if "bias" in w else scores.clone()
    group_gap = float("inf")
    if n_group > 1:
        g = choice.view(-1, n_group, E // n_group)
        gs = g.topk(2, dim=-1)[0].sum(-1) if version == 3 else g.max(-1).values
        top = gs.topk(min(topk_group + 1, n_group), dim=-1)
        if topk_group < n_group:
            group_gap = float((top.values[:, topk_group - 1] - top.values[:, topk_group]).min())
        mask = torch.zeros_like(gs).scatter_(1, top.indices[:, :topk_group], 1.0)
        # transformers 5.17: V3 masks the dropped groups with -inf, V2 with 0.
        fill = float("-inf") if version == 3 else 0.0
        choice = choice.masked_fill(~mask.repeat_interleave(E // n_group, dim=1).bool(), fill)
    top = choice.topk(top_k + 1, dim=-1)
    expert_gap = float((top.values[:, top_k - 1] - top.values[:, top_k]).min())
    ids = top.indices[:, :top_k]
    weights = scores.gather(1, ids) if "bias" in w else choice.gather(1, ids)
    if version == 3 and norm:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    weights = weights * scaling

    def mlp(v, gu, down):
        inter = gu.shape[0] // 2
        h = v @ gu.T
        return (torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]) @ down.T

    y = mlp(x, w["shared_gate_up"], w["shared_down"])
    for tok in range(x.shape[0]):
        for j in range(top_k):
            e = int(ids[tok, j])
            y[tok] += weights[tok, j] * mlp(x[tok:tok + 1], w["experts_gate_up"][e],
                                            w["experts_down"][e])[0]
    return y, expert_gap, group_gap


def make(name, spec, seed):
    version, method, n_group, topk_group, top_k, norm, scaling, n_shared = spec
    torch.manual_seed(seed)
    layer = build(*spec)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in sorted(layer.named_parameters()):
            std = 0.5 if pname == "gate.weight" else 0.15
            p.copy_(std * torch.randn(p.shape, generator=gen))
        for bname, b in layer.named_buffers():
            if bname.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))
    x = torch.randn(T, H, generator=gen)
    with torch.no_grad():
        y = layer(x.view(1, T, H)).view(T, H).float()
        y64 = layer.double()(x.double().view(1, T, H)).view(T, H)
    t = tensors_of(layer)
    ref, expert_gap, group_gap = reference(t, x, version, n_group, topk_group, top_k, norm,
                                           scaling)
    scale = float(y64.abs().max())
    ref_rel = float((ref - y64).abs().max()) / scale
    f32_rel = float((y.double() - y64).abs().max()) / scale
    meta = {"variant": name, "version": str(version), "topk_method": method,
            "n_group": str(n_group), "topk_group": str(topk_group), "top_k": str(top_k),
            "norm_topk_prob": str(norm).lower(), "routed_scaling_factor": repr(scaling),
            "n_shared_experts": str(n_shared), "seed": str(seed),
            "min_expert_gap": f"{expert_gap:.3e}", "min_group_gap": f"{group_gap:.3e}",
            "ref64_max_rel": f"{ref_rel:.2e}", "f32_vs_f64_max_rel": f"{f32_rel:.2e}",
            "transformers_version": transformers.__version__, "torch_version": torch.__version__}
    # transformers computes the router logits in f32 even in an fp64 module: ~1e-7 apart.
    ok = ref_rel < 1e-6 and expert_gap >= MIN_GAP and group_gap >= MIN_GAP
    return ok, {"x": x.contiguous(), "y": y.contiguous(), **t}, meta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out, exist_ok=True)
    failed = False
    for name, spec in VARIANTS.items():
        for seed in range(1, 61):
            ok, tensors, meta = make(name, spec, seed)
            if ok:
                break
        print(json.dumps(meta), flush=True)
        if not ok:
            failed = True
            continue
        save_file(tensors, os.path.join(args.out, f"{name}.safetensors"), metadata=meta)
    print("make_deepseek_moe_layer:", "FAILED" if failed else "OK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
