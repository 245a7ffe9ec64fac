#!/usr/bin/env python3
"""Checks the MoE fixtures' routing near-ties files (stdlib only; moe_routing_near_ties.py writes
them, tests/gpu/cuda_golden_lib.sh's compare reads them) against their fixtures.

  python3 tests/golden/check_near_ties.py FIXTURES_MLA_DIR

For every <variant>/routing_near_ties.json: one entry per prompt of expected.json, in order; an
alternative only where the matching last-token gap (an "expert" alternative: expert_gap, a
"group" one: group_gap) is below tau, so the GPU golden may excuse no prompt whose routing bf16
resolves; each alternative a vocabulary of finite logits, experts as many as
num_experts_per_tok, distinct, in range and not the reference's; and tau within its documented
bounds (at least 1e-3, at most the largest bf16 score noise measured, when above 1e-3). Exit 0
when all hold; otherwise prints each problem and exits 1.
"""

import json
import math
import os
import sys


def check(d, name):
    errs = []
    cfg = json.load(open(os.path.join(d, "config.json")))
    exp = json.load(open(os.path.join(d, "expected.json")))
    ties = json.load(open(os.path.join(d, "routing_near_ties.json")))
    k, experts, vocab = cfg["num_experts_per_tok"], cfg["n_routed_experts"], cfg["vocab_size"]
    tau, noise = ties["tau"], ties["bf16_score_noise"]
    if not 1e-3 <= tau <= max(1e-3, noise["max"]):
        errs.append(f"{name}: tau {tau} outside [1e-3, max(1e-3, noise max {noise['max']})]")
    if [p["index"] for p in ties["prompts"]] != list(range(len(exp["prompts"]))):
        errs.append(f"{name}: entries {[p['index'] for p in ties['prompts']]} != the prompts")
    for p in ties["prompts"]:
        where = f"{name} prompt {p['index']}"
        for a in p["alternatives"]:
            gap = p["expert_gap"] if a["what"] == "expert" else p["group_gap"]
            if a["what"] not in ("expert", "group") or not gap < tau:
                errs.append(f"{where}: a '{a['what']}' alternative with gap {gap} >= tau {tau}")
            ids = a["experts"]
            if len(ids) != k or len(set(ids)) != k or not all(0 <= e < experts for e in ids) \
                    or sorted(ids) == sorted(p["experts_f32"]):
                errs.append(f"{where}: alternative experts {ids} (reference {p['experts_f32']})")
            logits = a["last_prompt_logits"]
            if len(logits) != vocab or not all(math.isfinite(x) for x in logits):
                errs.append(f"{where}: alternative logits of length {len(logits)} or not finite")
        if len(p["experts_f32"]) != k:
            errs.append(f"{where}: {len(p['experts_f32'])} reference experts, top-k is {k}")
    return errs


def main():
    root = sys.argv[1]
    names = sorted(n for n in os.listdir(root)
                   if os.path.isfile(os.path.join(root, n, "routing_near_ties.json")))
    errs = [e for n in names for e in check(os.path.join(root, n), n)]
    for e in errs:
        print(e)
    print(f"check_near_ties: {len(names)} fixtures ({', '.join(names)}), {len(errs)} problems")
    return 1 if errs or not names else 0


if __name__ == "__main__":
    sys.exit(main())
