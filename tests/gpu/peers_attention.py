#!/usr/bin/env python3
"""Peers for the attention benchmarks (kernels/attention/cuda:attention_cuda_bench, prefill_attention_cuda_bench).

Runs PyTorch's scaled_dot_product_attention with the cuDNN and FlashAttention backends, and
torch's flex_attention compiled with torch.compile, on the same shapes as our benchmarks
(32 query / 8 KV heads, head_dim 128, bf16, contiguous KV: the peers are not paged):

  decode:  q_len 1, batch x context; time, GB/s (K + V + q + o bytes) and % of 4.3 TB/s
  prefill: causal, 1 x 4k, 1 x 16k, 8 x 2k, 2k new tokens over an 8k prefix; time and TFLOP/s,
           counting 4 * head_dim * num_q_heads * (sum over query rows of visible keys), as ours

  python3 tests/gpu/peers_attention.py [--modes decode,prefill] [--batches 1,16,64,256]
      [--contexts 1024,4096,16384,65536] [--flex_decode 1x16384,64x4096] [--no_flex]

Extend (q_len < kv_len) uses the bottom-right causal mask (torch.nn.attention.bias.
causal_lower_right; a flex mask_mod with the same offset). Timing: CUDA events around repeated
calls after warm-up; decode rotates several KV copies when one is smaller than ~1 GiB, so the
60 MB L2 does not serve repeated calls. A backend that refuses a shape, or a flex_attention
that fails to compile, prints the reason instead of a number.
"""
import argparse
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HQ, HKV, D = 32, 8, 128
PEAK = 4.3e12
PREFILL_SHAPES = [  # (name, batch, new tokens, prefix)
    ("1 x 4k prefill", 1, 4096, 0),
    ("1 x 16k prefill", 1, 16384, 0),
    ("8 x 2k prefill", 8, 2048, 0),
    ("2k new over 8k prefix", 1, 2048, 8192),
]


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


def short(e):
    msg = str(e).strip().splitlines()
    return (msg[0] if msg else type(e).__name__)[:100]


def sdpa_fn(backend, q, kvs, mask=None, causal=False):
    def fn(i):
        k, v = kvs[i % len(kvs)]
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                  enable_gqa=True)
    return fn


class Flex:
    """torch.compile'd flex_attention, or the reason it is unavailable."""

    def __init__(self, enabled):
        self.fn, self.error = None, None
        if not enabled:
            self.error = "disabled (--no_flex)"
            return
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            self.fn = torch.compile(flex_attention, dynamic=False)
            self.create_block_mask = create_block_mask
        except Exception as e:  # an old torch without flex_attention
            self.error = short(e)

    def make(self, q, kvs, offset=None):
        """offset: None for no mask (decode), else kv_idx <= q_idx + offset."""
        block_mask = None
        if offset is not None:
            def mask_mod(b, h, q_idx, kv_idx):
                return q_idx + offset >= kv_idx
            block_mask = self.create_block_mask(mask_mod, None, None, q.shape[2],
                                                kvs[0][0].shape[2], device="cuda")

        def fn(i):
            k, v = kvs[i % len(kvs)]
            return self.fn(q, k, v, block_mask=block_mask, enable_gqa=True)
        return fn


def run_decode(args, flex):
    print(f"decode, 32q/8kv d128 bf16, q_len 1, contiguous KV")
    print(f"{'batch':>6} {'context':>7} {'backend':>8} {'time_us':>10} {'GB/s':>8} {'%4.3TB/s':>8}")
    flex_shapes = {tuple(int(x) for x in s.split("x")) for s in args.flex_decode.split(",") if s}
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
            runs = [(name, lambda be=be: sdpa_fn(be, q, kvs)) for name, be in backends]
            if (b, ctx) in flex_shapes:
                runs.append(("flex", lambda: flex.make(q, kvs)))
            for name, make in runs:
                if name == "flex" and flex.fn is None:
                    print(f"{b:6d} {ctx:7d} {name:>8}  skipped: {flex.error}")
                    continue
                try:
                    sec = bench(make(), iters)
                    gbs = (kv_bytes + io) / sec / 1e9
                    print(f"{b:6d} {ctx:7d} {name:>8} {sec * 1e6:10.1f} {gbs:8.1f} "
                          f"{100 * gbs * 1e9 / PEAK:7.1f}%", flush=True)
                except Exception as e:  # a backend may refuse GQA or a shape
                    print(f"{b:6d} {ctx:7d} {name:>8}  n/a: {short(e)}", flush=True)
            del kvs, q
            torch.cuda.empty_cache()


def run_prefill(args, flex):
    from torch.nn.attention.bias import causal_lower_right
    print("prefill, causal, 32q/8kv d128 bf16, contiguous KV; TFLOP/s = 4 * head_dim * "
          "num_q_heads * sum over query rows of visible keys / time")
    print(f"{'shape':<22} {'backend':>8} {'time_us':>10} {'TFLOP/s':>8}")
    for name, b, new, prefix in PREFILL_SHAPES:
        s = prefix + new
        q = torch.randn(b, HQ, new, D, device="cuda", dtype=torch.bfloat16)
        kvs = [(torch.randn(b, HKV, s, D, device="cuda", dtype=torch.bfloat16),
                torch.randn(b, HKV, s, D, device="cuda", dtype=torch.bfloat16))]
        visible = b * (new * (prefix + 1) + new * (new - 1) / 2)
        flops = 4.0 * D * HQ * visible
        iters = int(min(200, max(3, 0.1 / (flops / 300e12))))
        if prefix == 0:
            sdpa_make = [(n, lambda be=be: sdpa_fn(be, q, kvs, causal=True))
                         for n, be in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                                       ("flash", SDPBackend.FLASH_ATTENTION))]
        else:
            mask = causal_lower_right(new, s)
            sdpa_make = [(n, lambda be=be: sdpa_fn(be, q, kvs, mask=mask))
                         for n, be in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                                       ("flash", SDPBackend.FLASH_ATTENTION))]
        runs = sdpa_make + [("flex", lambda: flex.make(q, kvs, offset=prefix))]
        for backend, make in runs:
            if backend == "flex" and flex.fn is None:
                print(f"{name:<22} {backend:>8}  skipped: {flex.error}")
                continue
            try:
                sec = bench(make(), iters)
                print(f"{name:<22} {backend:>8} {sec * 1e6:10.1f} {flops / sec * 1e-12:8.1f}",
                      flush=True)
            except Exception as e:
                print(f"{name:<22} {backend:>8}  n/a: {short(e)}", flush=True)
        del kvs, q
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default="decode,prefill")
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--contexts", default="1024,4096,16384,65536")
    ap.add_argument("--flex_decode", default="1x16384,64x4096,64x16384",
                    help="decode shapes (BATCHxCONTEXT) that also run flex_attention")
    ap.add_argument("--no_flex", action="store_true")
    ap.add_argument("--max_gb", type=float, default=80.0)
    args = ap.parse_args()
    dev = torch.cuda.get_device_properties(0)
    print(f"device: {dev.name}; torch {torch.__version__}")
    flex = Flex(not args.no_flex)
    modes = args.modes.split(",")
    if "prefill" in modes:
        run_prefill(args, flex)
    if "decode" in modes:
        run_decode(args, flex)
    return 0


if __name__ == "__main__":
    sys.exit(main())
