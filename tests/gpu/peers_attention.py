#!/usr/bin/env python3
"""Peers for the decode attention benchmark (kernels/cuda:attention_cuda_bench).

Runs PyTorch's scaled_dot_product_attention with the cuDNN and FlashAttention backends on the
same decode shapes (32 query / 8 KV heads, head_dim 128, bf16, q_len 1, contiguous KV: the peers
are not paged) and prints time, GB/s (K + V + q + o bytes) and % of 4.3 TB/s beside each other.

  python3 tests/gpu/peers_attention.py [--batches 1,16,64,256] [--contexts 1024,4096,16384,65536]

Timing: CUDA events around CUDA-graph replays when capture works, plain launches otherwise;
several KV copies are rotated when one is smaller than ~1 GiB, so the 60 MB L2 does not serve
repeated calls. A backend that refuses a shape prints its error instead of a number.
"""
import argparse
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HQ, HKV, D = 32, 8, 128
PEAK = 4.3e12


def bench(fn, iters):
    for _ in range(3):
        fn(0)
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(iters):
        fn(i)
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) * 1e-3 / iters


def run_backend(backend, q, kvs, gqa):
    def fn(i):
        k, v = kvs[i % len(kvs)]
        with sdpa_kernel(backend):
            if gqa:
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            return F.scaled_dot_product_attention(q, k, v)
    return fn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--contexts", default="1024,4096,16384,65536")
    ap.add_argument("--max_gb", type=float, default=80.0)
    args = ap.parse_args()
    dev = torch.cuda.get_device_properties(0)
    print(f"device: {dev.name}; torch {torch.__version__}; decode 32q/8kv d128 bf16, contiguous")
    print(f"{'batch':>6} {'context':>7} {'backend':>8} {'time_us':>10} {'GB/s':>8} {'%4.3TB/s':>8}")
    backends = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]
    for b in [int(x) for x in args.batches.split(",")]:
        for ctx in [int(x) for x in args.contexts.split(",")]:
            kv_bytes = 2 * b * HKV * ctx * D * 2
            if kv_bytes / 1e9 > args.max_gb:
                print(f"{b:6d} {ctx:7d}  skipped ({kv_bytes / 1e9:.1f} GB of KV)")
                continue
            copies = max(1, min(4, int(1.0e9 // kv_bytes)))
            q = torch.randn(b, HQ, 1, D, device="cuda", dtype=torch.bfloat16)
            kvs = [(torch.randn(b, HKV, ctx, D, device="cuda", dtype=torch.bfloat16),
                    torch.randn(b, HKV, ctx, D, device="cuda", dtype=torch.bfloat16))
                   for _ in range(copies)]
            io = 2 * b * HQ * D * 2
            iters = int(min(500, max(5, 0.02 / (kv_bytes / PEAK))))
            for name, backend in backends:
                try:
                    sec = bench(run_backend(backend, q, kvs, True), iters)
                    gbs = (kv_bytes + io) / sec / 1e9
                    print(f"{b:6d} {ctx:7d} {name:>8} {sec * 1e6:10.1f} {gbs:8.1f} "
                          f"{100 * gbs * 1e9 / PEAK:7.1f}%")
                except Exception as e:  # a backend may refuse GQA or a shape
                    msg = str(e).splitlines()[0][:90] if str(e) else type(e).__name__
                    print(f"{b:6d} {ctx:7d} {name:>8}  n/a: {msg}")
            del kvs, q
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
