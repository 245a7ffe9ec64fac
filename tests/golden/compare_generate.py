#!/usr/bin/env python3
"""Compares `generate --dump_last_logits` JSON lines with a reference (f32 rule: greedy tokens
identical, logits within 1e-4 * max|logit|).

  compare_generate.py OUT EXPECTED          against a fixture's expected.json (transformers)
  compare_generate.py --run OUT REF LABEL   against another run's JSON lines (e.g. TP=1, DCP=1)
"""
import json
import sys


def read_lines(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def compare(got_lines, want_tokens, want_logits):
    """Returns (mismatches, worst logit difference relative to max|ref|)."""
    bad, worst_rel = 0, 0.0
    for i, (got, tokens, logits_ref) in enumerate(zip(got_lines, want_tokens, want_logits)):
        if got["tokens"] != tokens:
            print(f"prompt {i}: tokens {got['tokens']} != {tokens}")
            bad += 1
        logits = got["last_prompt_logits"]
        scale = max(abs(x) for x in logits_ref)
        worst = max(abs(a - b) for a, b in zip(logits, logits_ref))
        if len(logits) != len(logits_ref) or worst > 1e-4 * scale:
            print(f"prompt {i}: logits differ by {worst} (tolerance {1e-4 * scale})")
            bad += 1
        worst_rel = max(worst_rel, worst / scale)
    return bad, worst_rel


def main(argv):
    if argv[0] == "--run":
        got, ref = read_lines(argv[1]), read_lines(argv[2])
        if len(got) != len(ref) or not got:
            print(f"got {len(got)} lines for {len(ref)} reference lines")
            return 1
        bad, worst = compare(got, [r["tokens"] for r in ref],
                             [r["last_prompt_logits"] for r in ref])
        print(f"  same tokens as {argv[3]} on {len(got)} prompts, worst logit diff "
              f"{worst:.2e} of max" if not bad else f"  {bad} mismatches against {argv[3]}")
        return 1 if bad else 0
    with open(argv[1]) as f:
        exp = json.load(f)
    lines = read_lines(argv[0])
    if len(lines) != len(exp["prompts"]):
        print(f"got {len(lines)} lines for {len(exp['prompts'])} prompts")
        return 1
    bad, _ = compare(lines, exp["greedy_tokens"], exp["last_prompt_logits"])
    print(f"compared {len(lines)} prompts, {bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
