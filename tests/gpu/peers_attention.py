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

  python3 tests/gpu/peers_attention.py --modes cudnn_prefill --json FILE [--dry_run]

The cuDNN column of attention_vs_flashinfer.py's prefill table: the four prefill shapes through
SDPA with only the cuDNN backend enabled, timed as FlashInfer's peer times (median of single
calls between CUDA events, each after a 256 MiB L2 flush), each output checked on 64 query rows
against an fp32 reference. GQA first as enable_gqa (8 KV heads); if cuDNN refuses, with the KV
heads expanded to 32 (said in the row). Extend (2k new over an 8k prefix) through
causal_lower_right and through an explicit bottom-right bool mask [1, 1, new, prefix + new] (a
dense mask: cuDNN cannot skip the masked tiles); the faster one that passes its check is the
row's time. Rows (or why cuDNN could not run) go to FILE as JSON; --dry_run writes fake timings
without torch (to rehearse the table).

  python3 tests/gpu/peers_attention.py --modes cudnn_ncu

The same cuDNN calls for a profiler (ncu --profile-from-start off): one call per shape (extend:
per mask) between cudaProfilerStart / Stop, after two warm calls; prints the profiled calls.
"""
import argparse
import json
import math
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:  # --dry_run on a machine without torch
    torch = None

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


def prefill_flops(b, new, prefix):
    """4 * head_dim * num_q_heads * (sum over query rows of visible keys), causal bottom-right."""
    return 4.0 * D * HQ * b * (new * prefix + new * (new + 1) / 2)


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
        flops = prefill_flops(b, new, prefix)
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


def median_us(fn, min_iters=20, max_iters=200, target_ms=300.0, warmup=5):
    """FlashInfer's peer timing (peers_flashinfer.py's bench_us): median microseconds of fn()
    between CUDA events, each call after a 256 MiB L2 flush and a GPU spin that covers twice the
    host's enqueue cost of one call."""
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        fn()
    host_us = (time.perf_counter() - t) / 10 * 1e6
    torch.cuda.synchronize()
    est_ms = max(bench(lambda i: fn(), 3) * 1e3, 1e-3)
    n = int(min(max(min_iters, target_ms / est_ms), max_iters))
    spin = int(min(2 * host_us, 2000) * 1e-6 * 2.0e9)  # ~2 GHz SM clock
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(n)]
    for start, stop in events:
        flush.zero_()
        if spin > 0:
            torch.cuda._sleep(spin)
        start.record()
        fn()
        stop.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in events) * 1e3


def check_rows(q, k, v, out, prefix):
    """Max |out - ref| over 64 query rows of request 0 (the first and last 32: the first rows tell
    a bottom-right diagonal from a top-left one) against fp32, and max |ref|."""
    new, g = q.shape[2], HQ // HKV
    rows = torch.cat([torch.arange(32), torch.arange(new - 32, new)]).cuda()
    qf = q[0, :, rows].float().view(HKV, g, len(rows), D)
    s = torch.einsum("hgqd,hkd->hgqk", qf, k[0].float()) / math.sqrt(D)
    keys = torch.arange(k.shape[2], device="cuda")[None, :]
    s = s.masked_fill(keys > prefix + rows[:, None], float("-inf"))
    ref = torch.einsum("hgqk,hkd->hgqd", torch.softmax(s, -1), v[0].float()).reshape(HQ, -1, D)
    return (out[0, :, rows].float() - ref).abs().max().item(), ref.abs().max().item()


def cudnn_call(q, k, v, mask, gqa):
    if not gqa:  # the KV heads expanded to the query heads, outside the timed call
        k, v = (x.repeat_interleave(HQ // HKV, dim=1) for x in (k, v))

    def fn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                                  enable_gqa=gqa)
    return fn


def cudnn_inputs(b, new, prefix):
    """Random q [b, 32, new, 128], k and v [b, 8, prefix + new, 128] (bf16) and the masks to try:
    [(name, mask)]: is_causal (None) without a prefix, else causal_lower_right and a bool mask."""
    from torch.nn.attention.bias import causal_lower_right
    s = prefix + new
    q = torch.randn(b, HQ, new, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, HKV, s, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    if not prefix:
        return q, k, v, [("is_causal", None)]
    keys = torch.arange(s, device="cuda")[None, :]
    bool_mask = (keys <= prefix + torch.arange(new, device="cuda")[:, None])[None, None]
    return q, k, v, [("causal_lower_right", causal_lower_right(new, s)), ("bool mask", bool_mask)]


def cudnn_shape(name, b, new, prefix):
    """One prefill shape through cuDNN: {"time_us", "TFLOPs", "how", "tried": [...]}."""
    q, k, v, masks = cudnn_inputs(b, new, prefix)
    row = {"name": name, "tried": []}
    for mask_name, mask in masks:
        for gqa in (True, False):
            how = f"{mask_name}, " + ("enable_gqa" if gqa else "KV heads expanded to 32")
            try:
                fn = cudnn_call(q, k, v, mask, gqa)
                err, ref_max = check_rows(q, k, v, fn(), prefix)
                ok = err <= 2e-2 * ref_max + 2e-3
                us = median_us(fn) if ok else None
            except Exception as e:  # cuDNN refused the shape, the mask or GQA
                row["tried"].append(f"{how}: n/a: {short(e)}")
                continue
            row["tried"].append(f"{how}: " + (f"{us:.1f} us" if ok else "CHECK FAILED") +
                                f", max err {err:.2e} of max|ref| {ref_max:.2f}")
            if ok and ("time_us" not in row or us < row["time_us"]):
                row.update(time_us=us, TFLOPs=prefill_flops(b, new, prefix) / us * 1e-6, how=how)
            break  # enable_gqa worked (or failed its check): no need to expand
    del q, k, v
    torch.cuda.empty_cache()
    return row


def run_cudnn_prefill(args):
    """The cuDNN column of attention_vs_flashinfer.py, written to args.json."""
    result = {"header": "", "rows": []}
    if args.dry_run:  # fake timings: ~500 TFLOP/s
        result["header"] = "DRY RUN: fake cuDNN timings"
        for name, b, new, prefix in PREFILL_SHAPES:
            us = prefill_flops(b, new, prefix) / 500e12 * 1e6
            result["rows"].append({"name": name, "time_us": us, "TFLOPs": 500.0,
                                   "how": "dry run", "tried": ["dry run"]})
    elif torch is None or not torch.cuda.is_available():
        result["header"] = "cuDNN SDPA unavailable: " + ("no torch" if torch is None else "no GPU")
    else:
        dev = torch.cuda.get_device_properties(0)
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        result["header"] = (f"cuDNN SDPA (torch {torch.__version__}, cuDNN {cudnn}) on {dev.name}: "
                            "contiguous [B, H, S, D] bf16, median of flushed single calls")
        for shape in PREFILL_SHAPES:
            torch.manual_seed(0)
            try:
                result["rows"].append(cudnn_shape(*shape))
            except Exception as e:  # e.g. out of memory: the next shape still runs
                result["rows"].append({"name": shape[0], "tried": [f"n/a: {short(e)}"]})
    print(result["header"])
    for r in result["rows"]:
        t = f"{r['time_us']:10.1f} us {r['TFLOPs']:6.1f} TFLOP/s ({r['how']})" \
            if "time_us" in r else "n/a"
        print(f"{r['name']:<22} {t}\n" + "".join(f"{'':<24}{x}\n" for x in r["tried"]), end="")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def run_cudnn_ncu(args):
    """cuDNN's prefill kernels for ncu --profile-from-start off: per shape, two warm calls (the
    cuDNN graph is built at the first), then one call between cudaProfilerStart / Stop; extend as
    causal_lower_right and as the bool mask, each with enable_gqa (or the KV heads expanded where
    cuDNN refuses it). Prints the profiled calls in order (ncu's launches follow it)."""
    for name, b, new, prefix in PREFILL_SHAPES:
        q, k, v, masks = cudnn_inputs(b, new, prefix)
        for mask_name, mask in masks:
            for gqa in (True, False):  # enable_gqa, else the KV heads expanded (not profiled)
                how = "enable_gqa" if gqa else "KV heads expanded to 32"
                try:
                    fn = cudnn_call(q, k, v, mask, gqa)
                    fn(), fn()
                    torch.cuda.synchronize()
                    torch.cuda.profiler.start()
                    fn()
                    torch.cuda.synchronize()
                    torch.cuda.profiler.stop()
                    print(f"profiled: {name}, {mask_name}, {how}", flush=True)
                    break
                except Exception as e:  # cuDNN refused the shape, the mask or GQA
                    print(f"not profiled: {name}, {mask_name}, {how}: {short(e)}", flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default="decode,prefill")
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--contexts", default="1024,4096,16384,65536")
    ap.add_argument("--flex_decode", default="1x16384,64x4096,64x16384",
                    help="decode shapes (BATCHxCONTEXT) that also run flex_attention")
    ap.add_argument("--no_flex", action="store_true")
    ap.add_argument("--max_gb", type=float, default=80.0)
    ap.add_argument("--json", default="", help="cudnn_prefill: its rows as JSON")
    ap.add_argument("--dry_run", action="store_true", help="cudnn_prefill: fake timings, no GPU")
    args = ap.parse_args()
    if args.modes == "cudnn_prefill":
        return run_cudnn_prefill(args)
    if args.modes == "cudnn_ncu":
        return run_cudnn_ncu(args)
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
