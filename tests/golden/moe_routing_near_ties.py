#!/usr/bin/env python3
"""Where a DeepSeek MoE golden fixture's routing is too close to call in bf16, and what the
logits are when the other side of the tie is taken (tests/golden/README.md, "Routing near-ties").

For each prompt of FIXTURE (a make_golden_deepseek_moe.py directory: layer 0 dense, the LAST
layer DeepSeek's MoE layer, so the routing of the last prompt token is the only routing the
last-prompt logits depend on):
  * f32 (transformers, CPU, as the fixture was made): the last token's routing and its margins
    (k-th vs (k+1)-th expert choice, last kept vs first dropped group), and the smallest margin
    over all the prompt's tokens;
  * bf16 (transformers, the same checkpoint cast): the last token's experts and the largest
    |score_bf16 - score_f32| of each token (the bf16 noise of the router's scores), and the
    cosine of its last-prompt logits to the f32 ones;
  * for a last-token margin below TAU (the 99th percentile of that noise over the fixture's
    prompt tokens, at least 1e-3: a margin above it is resolved by bf16), the f32 logits with the routing of the other side of the tie (the (k+1)-th
    expert instead of the k-th; the first dropped group kept instead of the last kept one),
    computed from the captured layer input and the checkpoint's expert weights; the same
    computation with the reference routing must reproduce transformers' logits (checked).

Writes OUT (routing_near_ties.json: tau, bf16_score_noise, one entry per prompt; prompts with
no alternatives have "alternatives": []). tests/gpu/cuda_golden_lib.sh's compare accepts a
prompt whose logits miss the reference when they match one of its alternatives.

  python3 tests/golden/moe_routing_near_ties.py FIXTURE OUT
"""

import json
import math
import sys

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def routing(logits, cfg, bias, groups=None, ids=None):
    """DeepSeek routing of one token as transformers computes it; `groups` / `ids` force the kept
    groups / the chosen experts (the weights follow from the scores). logits: [E] float64.
    Returns (ids, weights, expert gap, group gap, group order, scores, expert order)."""
    v3 = cfg["model_type"] == "deepseek_v3"
    scores = torch.sigmoid(logits) if v3 else torch.softmax(logits, -1)
    choice = scores + bias if bias is not None else scores.clone()
    e, g, k, t = choice.numel(), cfg["n_group"], cfg["num_experts_per_tok"], cfg["topk_group"]
    group_gap, gorder = math.inf, list(range(g))
    if g > 1:
        per = choice.view(g, e // g)
        gs = per.topk(2, -1)[0].sum(-1) if v3 else per.max(-1).values
        gorder = gs.argsort(descending=True, stable=True).tolist()
        group_gap = float(gs[gorder[t - 1]] - gs[gorder[t]])
        mask = torch.zeros(g, dtype=torch.bool)
        mask[gorder[:t] if groups is None else groups] = True
        choice = choice.masked_fill(~mask.repeat_interleave(e // g), -math.inf if v3 else 0.0)
    order = choice.argsort(descending=True, stable=True).tolist()
    ids = order[:k] if ids is None else ids
    expert_gap = float(choice[order[k - 1]] - choice[order[k]])
    w = scores[ids] if v3 else choice[ids]
    if cfg.get("norm_topk_prob", False) and v3:  # V2 ignores norm_topk_prob
        w = w / (w.sum() + 1e-20)
    return ids, w * cfg["routed_scaling_factor"], expert_gap, group_gap, gorder, scores, order


class Capture:
    """The last layer's post-attention residual (input of post_attention_layernorm) and its MLP
    input, of the last forward."""

    def __init__(self, model):
        layer = model.model.layers[-1]
        self.hooks = [
            layer.post_attention_layernorm.register_forward_pre_hook(
                lambda m, a: setattr(self, "residual", a[0].detach())),
            layer.mlp.register_forward_pre_hook(lambda m, a: setattr(self, "h", a[0].detach())),
        ]


def moe_out(h, ids, weights, st, prefix, shared):
    """DeepSeek's MoE output for one token h [H] (float64) with the given routing."""
    def mlp(p):
        g = st[p + "gate_proj.weight"].double() @ h
        u = st[p + "up_proj.weight"].double() @ h
        return st[p + "down_proj.weight"].double() @ (F.silu(g) * u)
    y = sum(w * mlp(f"{prefix}experts.{i}.") for i, w in zip(ids, weights.tolist()))
    return y + mlp(prefix + "shared_experts.") if shared else y


def make_logits(model, residual, h, st, prefix, shared):
    """route -> lm_head(norm(residual + MoE(h) with that routing)), float64."""
    head = model.lm_head.weight.double()

    def logits_with(route):
        y = moe_out(h, route[0], route[1], st, prefix, shared)
        with torch.no_grad():
            x = model.model.norm((residual + y).float().view(1, 1, -1)).double()[0, 0]
        return head @ x
    return logits_with


def main():
    fixture, out_path = sys.argv[1:3]
    torch.set_num_threads(1)
    cfg = json.load(open(f"{fixture}/config.json"))
    exp = json.load(open(f"{fixture}/expected.json"))
    st = load_file(f"{fixture}/model.safetensors")
    last = cfg["num_hidden_layers"] - 1
    assert cfg["first_k_dense_replace"] == last, "the MoE layer must be the last layer alone"
    prefix = f"model.layers.{last}.mlp."
    bias = st.get(prefix + "gate.e_score_correction_bias")
    bias = bias.double() if bias is not None else None
    gate = st[prefix + "gate.weight"].double()
    shared = cfg.get("n_shared_experts") or 0
    models = {d: AutoModelForCausalLM.from_pretrained(fixture, dtype=d, attn_implementation="eager")
              .eval() for d in (torch.float32, torch.bfloat16)}
    caps = {d: Capture(m) for d, m in models.items()}
    rows, noise = [], []  # per token: max over experts of |score_bf16 - score_f32|
    for i, ids in enumerate(exp["prompts"]):
        row, logits = {"index": i}, {}
        for d, m in models.items():
            with torch.no_grad():
                logits[d] = m(torch.tensor([ids])).logits[0, -1].double()
        c32, c16 = caps[torch.float32], caps[torch.bfloat16]
        h = c32.h[0].double()
        r32 = [routing(gate @ h[t], cfg, bias) for t in range(len(ids))]
        # transformers' DeepSeek routers take fp32 logits of the (bf16) input and weight.
        gate16 = models[torch.bfloat16].model.layers[-1].mlp.gate.weight.float()
        router16 = (c16.h[0].float() @ gate16.T).double()
        r16 = [routing(router16[t], cfg, bias) for t in range(len(ids))]
        noise += [float((a[5] - b[5]).abs().max()) for a, b in zip(r32, r16)]
        ids32, _, eg, gg, _, _, _ = r32[-1]
        row.update(experts_f32=sorted(ids32), experts_bf16=sorted(r16[-1][0]), expert_gap=eg,
                   group_gap=gg, min_gap_all_tokens=min(min(x[2], x[3]) for x in r32),
                   bf16_cosine_to_f32=float(F.cosine_similarity(logits[torch.bfloat16],
                                                                logits[torch.float32], 0)))
        # The last-token logits from the captured pieces, with a given routing of that token.
        logits_with = make_logits(models[torch.float32], c32.residual[0, -1].double(), h[-1],
                                  st, prefix, shared)
        check = float((logits_with(r32[-1]) - logits[torch.float32]).abs().max())
        assert check < 1e-4 * float(logits[torch.float32].abs().max()), (i, check)
        row["alternatives"] = []
        rows.append((row, r32[-1], logits_with, h[-1]))
    noise.sort()
    tau = max(1e-3, noise[int(0.99 * len(noise))])
    k, t = cfg["num_experts_per_tok"], cfg["topk_group"]
    for row, (_, _, eg, gg, gorder, _, order), logits_with, h in rows:
        alts = []
        if eg < tau:  # the (k+1)-th expert instead of the k-th, in the same kept groups
            alts.append(("expert", routing(gate @ h, cfg, bias, None, order[:k - 1] + [order[k]])))
        if gg < tau:  # the first dropped group kept instead of the last kept one
            alts.append(("group", routing(gate @ h, cfg, bias, gorder[:t - 1] + [gorder[t]])))
        for what, (ids, wts, *_rest) in alts:
            row["alternatives"].append({
                "what": what, "experts": sorted(ids),
                "last_prompt_logits": [round(float(x), 6) for x in logits_with((ids, wts))]})
    doc = {"fixture": fixture.rstrip("/").split("/")[-1], "tau": tau,
           "transformers_version": transformers.__version__, "torch_version": torch.__version__,
           "bf16_score_noise": {"median": noise[len(noise) // 2], "max": noise[-1]},
           "prompts": [r[0] for r in rows]}
    json.dump(doc, open(out_path, "w"), separators=(",", ":"))
    for r in rows:
        x = r[0]
        print(f"prompt {x['index']}: experts f32 {x['experts_f32']} bf16 {x['experts_bf16']}, "
              f"gaps expert {x['expert_gap']:.2e} group {x['group_gap']:.2e} (all tokens "
              f"{x['min_gap_all_tokens']:.2e}), bf16 cosine {x['bf16_cosine_to_f32']:.5f}, "
              f"{len(x['alternatives'])} alternatives")
    print(f"tau {tau:.2e} (99th percentile of the bf16 score noise over {len(noise)} tokens; "
          f"median {noise[len(noise) // 2]:.2e}, max {noise[-1]:.2e})")


if __name__ == "__main__":
    main()
