#!/usr/bin/env python3
"""FlashInfer's MLA decode (BatchMLAPagedAttentionWrapper) at mla_cuda_bench's DeepSeek-V3 shape
(128 heads, latent 512 + 64, bf16, page 64, q_len 1), for BENCHMARKS.md's peer column.

  PYTHONPATH=<unpacked flashinfer site> python3 kernels/mla/mla_flashinfer_peer.py [B,...] [CTX,...]

Prints one row per config: batch, ctx, us per call (mean of 20 between CUDA events after 3
warm-ups, rotating over page sets so calls do not run from L2) and TB/s of latent bytes read
(ctx x 576 x 2 per request), or the exception when the package cannot run it.
"""
import sys
import time

import torch

H, CKV, KPE, PAGE = 128, 512, 64, 64


def main():
    batches = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "1,16,64,128").split(",")]
    ctxs = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1024,4096,16384,32768").split(",")]
    t0 = time.time()
    import flashinfer
    print("flashinfer", flashinfer.__version__, flush=True)
    dev = torch.device("cuda:0")
    pages_total = max(2 << 30, max(batches) * max(ctxs) * (CKV + KPE) * 2) // (PAGE * (CKV + KPE) * 2)
    ckv = torch.randn(pages_total, PAGE, CKV, dtype=torch.bfloat16, device=dev)
    kpe = torch.randn(pages_total, PAGE, KPE, dtype=torch.bfloat16, device=dev)
    wss = [torch.empty(128 << 20, dtype=torch.int8, device=dev) for _ in range(16)]
    print("| batch | ctx | us | TB/s |\n| --- | --- | --- | --- |", flush=True)
    for b in batches:
        for c in ctxs:
            pps = (c + PAGE - 1) // PAGE
            sets = max(1, min(16, pages_total // (b * pps)))
            perm = torch.randperm(pages_total, device=dev, dtype=torch.int32)
            wrappers = []
            for s in range(sets):
                w = flashinfer.mla.BatchMLAPagedAttentionWrapper(wss[s], backend="auto")
                w.plan(torch.arange(b + 1, dtype=torch.int32, device=dev),
                       torch.arange(b + 1, dtype=torch.int32, device=dev) * pps,
                       perm[s * b * pps:(s + 1) * b * pps].contiguous(),
                       torch.full((b,), c, dtype=torch.int32, device=dev),
                       H, CKV, KPE, PAGE, False, 192 ** -0.5, torch.bfloat16, torch.bfloat16)
                wrappers.append(w)
                if s == 0:
                    q_nope = torch.randn(b, H, CKV, dtype=torch.bfloat16, device=dev)
                    q_pe = torch.randn(b, H, KPE, dtype=torch.bfloat16, device=dev)
            for i in range(3):
                wrappers[i % sets].run(q_nope, q_pe, ckv, kpe)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for i in range(20):
                wrappers[i % sets].run(q_nope, q_pe, ckv, kpe)
            e1.record()
            torch.cuda.synchronize()
            us = e0.elapsed_time(e1) * 1e3 / 20
            print(f"| {b} | {c} | {us:.1f} | {b * c * (CKV + KPE) * 2 / us / 1e6:.2f} |", flush=True)
    print(f"done in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
