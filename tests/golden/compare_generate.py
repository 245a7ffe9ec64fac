#!/usr/bin/env python3
"""Compares `generate --dump_last_logits` JSON lines with a fixture's expected.json (f32 rule:
greedy tokens identical, logits within 1e-4 * max|logit|). Usage: compare_generate.py OUT EXPECTED"""
import json
import sys


def main(out_path, expected_path):
    with open(expected_path) as f:
        exp = json.load(f)
    with open(out_path) as f:
        lines = [json.loads(l) for l in f if l.strip()]
    if len(lines) != len(exp["prompts"]):
        print(f"got {len(lines)} lines for {len(exp['prompts'])} prompts")
        return 1
    bad = 0
    for i, (got, want_tokens, want_logits) in enumerate(
            zip(lines, exp["greedy_tokens"], exp["last_prompt_logits"])):
        if got["tokens"] != want_tokens:
            print(f"prompt {i}: tokens {got['tokens']} != {want_tokens}")
            bad += 1
        logits = got["last_prompt_logits"]
        tol = 1e-4 * max(abs(x) for x in want_logits)
        worst = max(abs(a - b) for a, b in zip(logits, want_logits))
        if len(logits) != len(want_logits) or worst > tol:
            print(f"prompt {i}: logits differ by {worst} (tolerance {tol})")
            bad += 1
    print(f"compared {len(lines)} prompts, {bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
