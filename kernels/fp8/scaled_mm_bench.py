#!/usr/bin/env python3
"""PyTorch's FP8 GEMM at the shapes fp8_cuda_bench times (issue 38 item 5), for the same call:
torch._scaled_mm per-tensor (scalar scales) and row-wise (per-token x per-channel), next to
torch.matmul in bf16. Prints one line per (shape, M): TFLOP/s of each.

  python3 kernels/fp8/scaled_mm_bench.py [--iters 20]
  python3 kernels/fp8/scaled_mm_bench.py --tandem_lib=PATH/libtandem_fp8_gemm.so [--iters 20]
      [--rounds 6] [--scaling tensor|rowwise]

With --tandem_lib (//kernels/fp8:libtandem_fp8_gemm.so, fp8_gemm_capi.cc): our FP8 GEMM
(CublasLtFp8Gemm::Linear) and torch._scaled_mm in one process on the same random e4m3 operands and
scales, timed in alternating rounds of --iters calls (ours first in even rounds, torch first in odd
ones), so both run under the same clocks. Prints per (shape, M): the mean TFLOP/s of each, the
ratio ours / torch of each round (min, median, max) and max|ours - torch| / max|torch| (the two
products must agree: the same FP8 GEMM, bf16 output).
"""
import argparse
import ctypes
import statistics

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


def load_tandem(path):
    lib = ctypes.CDLL(path)
    lib.tandem_fp8_gemm_create.restype = ctypes.c_void_p
    lib.tandem_fp8_gemm_destroy.argtypes = [ctypes.c_void_p]
    lib.tandem_fp8_gemm_linear.restype = ctypes.c_int
    lib.tandem_fp8_gemm_linear.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
        ctypes.c_void_p]
    return lib


def clock_fair(args):
    """Ours and torch._scaled_mm in alternating rounds (the module docstring)."""
    lib = load_tandem(args.tandem_lib)
    gemm = lib.tandem_fp8_gemm_create()
    if not gemm:
        raise SystemExit("tandem_fp8_gemm_create failed")
    rowwise = args.scaling == "rowwise"
    stream = torch.cuda.current_stream().cuda_stream
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"scaling {args.scaling}, {args.rounds} rounds x {args.iters} calls")
    print("| shape | M | ours TFLOP/s | _scaled_mm TFLOP/s | ours / torch min | median | max "
          "| max rel diff |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    gen = torch.Generator(device="cuda").manual_seed(1)
    for name, n, k in SHAPES:
        w8 = torch.randn(n, k, device="cuda", generator=gen).to(torch.float8_e4m3fn)
        for m in (1024, 4096, 16384):
            a8 = torch.randn(m, k, device="cuda", generator=gen).to(torch.float8_e4m3fn)
            if rowwise:
                sa = torch.rand(m, 1, device="cuda", generator=gen) * 0.5 + 0.5
                sb = torch.rand(1, n, device="cuda", generator=gen) * 0.5 + 0.5
            else:
                sa = torch.tensor(0.75, device="cuda")
                sb = torch.tensor(0.625, device="cuda")
            sa_ours, sb_ours = sa.reshape(-1).contiguous(), sb.reshape(-1).contiguous()
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

            def ours():
                rc = lib.tandem_fp8_gemm_linear(
                    gemm, a8.data_ptr(), sa_ours.data_ptr(), w8.data_ptr(), sb_ours.data_ptr(),
                    1 if rowwise else 0, m, n, k, out.data_ptr(), stream)
                if rc != 0:
                    raise SystemExit(f"tandem_fp8_gemm_linear failed at {name} {m}")

            def theirs():
                return torch._scaled_mm(a8, w8.t(), scale_a=sa, scale_b=sb,
                                        out_dtype=torch.bfloat16)

            ours()
            ref = theirs()
            torch.cuda.synchronize()
            diff = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            flops = 2.0 * m * n * k
            t_ours, t_theirs, ratios = [], [], []
            for r in range(args.rounds):
                pair = (ours, theirs) if r % 2 == 0 else (theirs, ours)
                times = [time_us(fn, args.iters) for fn in pair]
                to, tt = (times[0], times[1]) if r % 2 == 0 else (times[1], times[0])
                t_ours.append(to)
                t_theirs.append(tt)
                ratios.append(tt / to)  # > 1: ours faster
            print(f"| {name} | {m} | {flops / statistics.mean(t_ours) / 1e6:.0f} | "
                  f"{flops / statistics.mean(t_theirs) / 1e6:.0f} | {min(ratios):.3f} | "
                  f"{statistics.median(ratios):.3f} | {max(ratios):.3f} | {diff:.2e} |",
                  flush=True)
            del a8, out, ref
    lib.tandem_fp8_gemm_destroy(gemm)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--tandem_lib", default="")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--scaling", choices=["tensor", "rowwise"], default="tensor")
    args = parser.parse_args()
    if args.tandem_lib:
        clock_fair(args)
        return
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
