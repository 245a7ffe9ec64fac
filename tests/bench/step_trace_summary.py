#!/usr/bin/env python3
"""Reads a worker's step trace (tandem_worker --step_trace=PATH, runtime/worker/step_trace.h) and
says where the time between tokens goes.

  step_trace_summary.py STEPS.jsonl [--requests=REQUESTS.jsonl] [--skip_s=S]

Prints, per kind of step (decode-only at each batch size, prompt tokens with decodes, prompt
tokens alone): how many, and step_us p50 / p90 / p99 / max; the loop's gap between steps; the
token interval a decoding request sees (from the previous step's end to this step's end, one
sample per decoding sequence, so batch sizes weigh as in a client's ITL) with its p50 / p90 / p99,
and which kinds of step make up the slowest 1% of those intervals. --requests: tandem_bench's
--requests_out file, whose client-side ITL gaps are printed beside. --skip_s drops the trace's
first S seconds (start-up, warm-up requests).
"""
import argparse
import json
import sys


def pct(values, q):
    """The q-quantile (0..1) of `values` by nearest rank; 0 for none."""
    if not values:
        return 0
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * len(s) + 0.5)) - 1))]


def kind(step):
    if step["prefill_tokens"] == 0:
        return "decode b=%d" % step["decode"]
    return "prompt+decode" if step["decode"] > 0 else "prompt only"


def load(path, skip_s):
    steps = []
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if "step" not in rec:  # {"truncated_after": N}
                continue
            if rec["t_us"] >= skip_s * 1e6:
                steps.append(rec)
    return steps


def row(name, values):
    return "%-16s %7d %9.0f %9.0f %9.0f %9.0f" % (
        name, len(values), pct(values, 0.5), pct(values, 0.9), pct(values, 0.99),
        max(values) if values else 0)


def summarize(steps, requests_path=None, out=sys.stdout):
    print("%-16s %7s %9s %9s %9s %9s" % ("step kind", "steps", "p50 us", "p90 us", "p99 us",
                                         "max us"), file=out)
    by_kind = {}
    for s in steps:
        by_kind.setdefault(kind(s), []).append(s["step_us"])
    for k in sorted(by_kind, key=lambda k: (k.startswith("prompt"), len(k), k)):
        print(row(k, by_kind[k]), file=out)
    print(row("loop gap", [s["gap_us"] for s in steps]), file=out)

    # The interval a decoding sequence of step i sees: end of step i-1 to end of step i.
    intervals = []  # (us, kind of this step, kind of the previous step)
    for prev, cur in zip(steps, steps[1:]):
        span = cur["t_us"] + cur["step_us"] - (prev["t_us"] + prev["step_us"])
        intervals += [(span, kind(cur), kind(prev))] * cur["decode"]
    spans = [i[0] for i in intervals]
    print(row("token interval", spans), file=out)
    if spans:
        cut = pct(spans, 0.99)
        tail = [i for i in intervals if i[0] >= cut]
        share = {}
        for _, k, p in tail:
            share[(k, p)] = share.get((k, p), 0) + 1
        print("slowest 1%% of token intervals (>= %.0f us, %d samples), by this step / previous "
              "step:" % (cut, len(tail)), file=out)
        for (k, p), n in sorted(share.items(), key=lambda x: -x[1]):
            print("  %-16s after %-16s %5.1f%%" % (k, p, 100.0 * n / len(tail)), file=out)
    if requests_path:
        gaps = []
        with open(requests_path) as f:
            for line in f:
                gaps += [g * 1000 for g in json.loads(line).get("itl_ms", [])]
        print(row("client ITL", gaps), file=out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("steps")
    ap.add_argument("--requests")
    ap.add_argument("--skip_s", type=float, default=0)
    a = ap.parse_args()
    summarize(load(a.steps, a.skip_s), a.requests)


if __name__ == "__main__":
    main()
