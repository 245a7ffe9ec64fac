#!/usr/bin/env python3
"""Load-balance model of the persistent prefill kernels' static schedule (prefill_common.cuh).

Each work item (128 query rows of one request and kv head) costs its visible key tiles plus a
fixed ~2 tiles of per-item overhead (the fit in kernels/attention/cuda/README.md). Prints, per benchmark
shape of prefill_attention_cuda_bench, the busiest CTA's load over the mean for four walks:
plain or alternating round-robin (WalkItem), one tile order for all requests or alternating per
request (GetWork). 1.00 is perfect balance.

  python3 kernels/attention/cuda/prefill_schedule_model.py [--grid 132]
"""
import argparse


def item_weights(reqs, group=4, kv_heads=8, rows=128, keys=128, alternate_requests=False):
    """reqs: (q_len, prefix) per request; returns item weights in item-index order."""
    weights = []
    for s, (q_len, prefix) in enumerate(reqs):
        n_tiles = (q_len * group + rows - 1) // rows
        order = list(range(n_tiles - 1, -1, -1))  # newest tile (most keys) first
        if alternate_requests and s % 2 == 1:
            order.reverse()
        for tile in order:
            last_token = min(q_len, ((tile + 1) * rows - 1) // group + 1)
            key_tiles = (prefix + last_token - 1) // keys + 1
            weights += [key_tiles + 2] * kv_heads
    return weights


def busiest_over_mean(weights, grid, alternate_rounds):
    load = [0] * grid
    rounds = (len(weights) + grid - 1) // grid
    for r in range(rounds):
        for b in range(grid):
            w = r * grid + (grid - 1 - b if alternate_rounds and r % 2 else b)
            if w < len(weights):
                load[b] += weights[w]
    return max(load) / (sum(weights) / grid)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--grid", type=int, default=132)
    args = parser.parse_args()
    shapes = {
        "1 x 4k": [(4096, 0)],
        "1 x 16k": [(16384, 0)],
        "8 x 2k": [(2048, 0)] * 8,
        "2k over 8k": [(2048, 8192)],
    }
    print(f"{'shape':<12} {'rr':>6} {'alt rounds':>11} {'alt reqs':>9} {'both':>6}")
    for name, reqs in shapes.items():
        cells = []
        for alt_req, alt_rounds in ((False, False), (False, True), (True, False), (True, True)):
            w = item_weights(reqs, alternate_requests=alt_req)
            cells.append(busiest_over_mean(w, args.grid, alt_rounds))
        print(f"{name:<12} {cells[0]:6.3f} {cells[1]:11.3f} {cells[2]:9.3f} {cells[3]:6.3f}")


if __name__ == "__main__":
    main()
