#!/usr/bin/env python3
"""FlashInfer's attention kernels for a profiler: the FlashInfer package's peers_flashinfer.py run
on the given shapes and variants only, each with its first call and then CALLS more instead of
~300 ms of timed calls, without its spot checks. The peer's site-packages must be on PYTHONPATH
(attention_call_lib.sh's fi_ncu runs it so, under ncu).

  fi_ncu_driver.py PEERS_FLASHINFER_PY OUTFILE [--decode BxL,...] [--variants NAME,...]
      [--prefill LABEL,...] [--backends fa2,fa3] [--calls N]

--decode: decode shapes (e.g. 1x4096,64x16384); --variants: of cuda-core, tc-fa2, tc-fa3;
--prefill: the peer's prefill labels (1x4096, 1x16384, 8x2048, "2k new / 8k prefix");
--backends: of fa2, fa3. OUTFILE: the peer's table (no times: the driver does not time).
"""
import argparse
import importlib.util
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("peer", help="the FlashInfer package's peers_flashinfer.py")
    ap.add_argument("outfile")
    ap.add_argument("--decode", default="")
    ap.add_argument("--variants", default="cuda-core,tc-fa2,tc-fa3")
    ap.add_argument("--prefill", default="")
    ap.add_argument("--backends", default="fa2,fa3")
    ap.add_argument("--calls", type=int, default=4)
    args = ap.parse_args()
    import torch

    sys.argv = ["peers_flashinfer.py", args.outfile]  # the peer reads its arguments on import
    spec = importlib.util.spec_from_file_location("peers", args.peer)
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    peer.DECODE_SHAPES = [tuple(int(x) for x in s.split("x")) for s in args.decode.split(",") if s]
    peer.PREFILL_SHAPES = [s for s in peer.PREFILL_SHAPES if s[0] in args.prefill.split(",")]
    peer.DECODE_VARIANTS = [v for v in peer.DECODE_VARIANTS if v[0] in args.variants.split(",")]
    peer.PREFILL_BACKENDS = [b for b in peer.PREFILL_BACKENDS if b in args.backends.split(",")]
    peer.spot_checks = lambda lines: None

    def few_calls(fn, **unused):
        for _ in range(args.calls):
            fn()
        torch.cuda.synchronize()
        return float("nan"), args.calls, 0.0  # no time: the table's cells read nan

    peer.bench_us = few_calls
    peer.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
