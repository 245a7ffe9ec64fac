#!/usr/bin/env python3
"""PyTorch's FP8 GEMM at the shapes fp8_cuda_bench times (issue 38 item 5), for the same call:
torch._scaled_mm per-tensor (scalar scales) and row-wise (per-token x per-channel), next to
torch.matmul in bf16. Prints one line per (shape, M): TFLOP/s of each.

  python3 kernels/fp8/scaled_mm_bench.py [--iters 20]
"""
import argparse

import torch

SHAPES = [("8b.qkv_proj", 6144, 4096), ("8b.o_proj", 4096, 4096),
          ("8b.gate_up_proj", 28672, 4096), ("8b.down_proj", 4096, 14336),
          ("70b.qkv_proj", 10240, 8192), ("70b.o_proj", 8192, 8192),
          ("70b.gate_up_proj", 57344, 8192), ("70b.down_proj", 8192, 28672)]


def time_us(fn, iters):
    for _ in range(3):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return 1000.0 * start.elapsed_time(stop) / iters


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    print("shape M torch_bf16_TFLOPs scaled_mm_tensor_TFLOPs scaled_mm_rowwise_TFLOPs")
    for name, n, k in SHAPES:
        w16 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        w8 = w16.to(torch.float8_e4m3fn)
        for m in (1024, 4096, 16384):
            a16 = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            a8 = a16.to(torch.float8_e4m3fn)
            one = torch.ones((), device="cuda", dtype=torch.float32)
            sa = torch.ones(m, 1, device="cuda", dtype=torch.float32)
            sb = torch.ones(1, n, device="cuda", dtype=torch.float32)
            flops = 2.0 * m * n * k
            t16 = time_us(lambda: a16 @ w16.t(), args.iters)
            tt = time_us(lambda: torch._scaled_mm(a8, w8.t(), scale_a=one, scale_b=one,
                                                  out_dtype=torch.bfloat16), args.iters)
            try:
                tr = time_us(lambda: torch._scaled_mm(a8, w8.t(), scale_a=sa, scale_b=sb,
                                                      out_dtype=torch.bfloat16), args.iters)
            except RuntimeError as e:  # row-wise scaling needs a recent torch / sm_89+
                print(f"{name} {m}: row-wise _scaled_mm failed: {e}")
                tr = float("inf")
            print(f"{name} {m} {flops / t16 / 1e6:.0f} {flops / tt / 1e6:.0f} "
                  f"{flops / tr / 1e6:.0f}", flush=True)
            del a16, a8


if __name__ == "__main__":
    main()
