#!/usr/bin/env python3
"""Hugging Face `tokenizers` on the same file as tokenizer_bench (one thread, line by line,
best of --repeat): encode and decode MB/s."""
import argparse
import os
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
import tokenizers  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--tokenizer", required=True)
p.add_argument("--text", required=True)
p.add_argument("--repeat", type=int, default=3)
a = p.parse_args()
tok = tokenizers.Tokenizer.from_file(a.tokenizer)
raw = open(a.text, "rb").read()
lines = raw.decode("utf-8").split("\n")
best_e = best_d = 0.0
for _ in range(a.repeat):
    t = time.perf_counter()
    ids = [tok.encode(line, add_special_tokens=False).ids for line in lines]
    e = time.perf_counter() - t
    t = time.perf_counter()
    out = sum(len(tok.decode(v, skip_special_tokens=False).encode()) for v in ids)
    d = time.perf_counter() - t
    best_e = max(best_e, len(raw) / e / 1e6)
    best_d = max(best_d, out / d / 1e6)
print("hf %s %d bytes, %d lines, %d tokens: encode %.2f MB/s, decode %.2f MB/s"
      % (tokenizers.__version__, len(raw), len(lines), sum(map(len, ids)), best_e, best_d))
