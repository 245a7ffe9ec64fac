#!/usr/bin/env python3
"""Ratio table of tests/gpu/attention_vs_flashinfer.sh: reads OUT/{ours,baseline}_{decode,prefill}.txt
(attention_cuda_bench / prefill_attention_cuda_bench output) and OUT/flashinfer.txt.json (the
FlashInfer peer's rows) and prints, per shape, FlashInfer's best variant's time over ours
(> 1: ours faster). With OUT/cudnn_prefill.json (peers_attention.py --modes cudnn_prefill) the
prefill table has a cuDNN column too: cuDNN's time over ours (the issue's target: >= 0.95).

  attention_vs_flashinfer.py OUT

Decode bandwidth is counted the peer's way: K+V bytes read + q + out (bf16), over the time.
"""
import json
import os
import re
import sys

HQ, HK, D = 32, 8, 128
DECODE_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\S+)\s+(mma|fma)\s+(\d+)\s+([\d.]+)\s+([\d.]+)"
                        r"\s+([\d.]+)\s+([\d.]+)%")
# prefill_attention_cuda_bench's names -> the peer's labels
PREFILL_NAMES = {"1 x 4k prefill": "1x4096", "1 x 16k prefill": "1x16384",
                 "8 x 2k prefill": "8x2048", "2k new over 8k prefix": "2k new / 8k prefix"}
PREFILL_FLOPS = {"1x4096": [(4096, 4096)], "1x16384": [(16384, 16384)],
                 "8x2048": [(2048, 2048)] * 8, "2k new / 8k prefix": [(2048, 10240)]}


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def our_decode(text):
    """{(dtype, core, 'BxL'): (time_us, splits, pct_of_4.3)} (first row of each)."""
    rows = {}
    for line in text.splitlines():
        m = DECODE_ROW.match(line)
        if m:
            key = (m.group(3), m.group(4), f"{m.group(1)}x{m.group(2)}")
            rows.setdefault(key, (float(m.group(6)), int(m.group(5)), float(m.group(9))))
    return rows


def our_prefill(text):
    """{peer label: wgmma kernel time_us}."""
    rows = {}
    for line in text.splitlines():
        for name, label in PREFILL_NAMES.items():
            if line.startswith(name):
                rows[label] = float(line[len(name):].split()[0])
    return rows


def peer_best(fi_rows, kind):
    """{shape: (variant, time_us)}: the fastest variant that ran."""
    best = {}
    for r in fi_rows:
        if r.get("kind") != kind or "time_us" not in r:
            continue
        if r["shape"] not in best or r["time_us"] < best[r["shape"]][1]:
            best[r["shape"]] = (r["variant"], r["time_us"])
    return best


def decode_bytes(shape):
    b, l = (int(x) for x in shape.split("x"))
    return b * l * HK * D * 2 * 2 + 2 * b * HQ * D * 2


def prefill_flops(label):
    return 4 * D * HQ * sum(q * (k - q) + q * (q + 1) // 2 for q, k in PREFILL_FLOPS[label])


def read_cudnn(out):
    """{peer label: cuDNN row} from OUT/cudnn_prefill.json; its header printed (or why not)."""
    text = read(os.path.join(out, "cudnn_prefill.json"))
    if not text:
        return {}
    data = json.loads(text)
    print("\n" + data.get("header", ""))
    return {PREFILL_NAMES[r["name"]]: r for r in data.get("rows", []) if r["name"] in PREFILL_NAMES}


def prefill_table(ours_p, base_p, fi_pre, cudnn, ratios):
    """Prints the prefill rows (FlashInfer's best and cuDNN beside ours), adds their ratios."""
    print("\nprefill, causal (wgmma kernel; TFLOP/s = 4 d Hq sum(visible keys) / time; ratio = "
          "peer time / ours)")
    print(f"{'shape':>18s} {'ours_us':>9s} {'TFLOP/s':>7s} {'FI best':>7s} {'FI_us':>9s} "
          f"{'TFLOP/s':>7s} {'ratio':>6s}" + (f" {'base_us':>9s} {'ratio':>6s}" if base_p else "") +
          (f" {'cuDNN_us':>9s} {'TFLOP/s':>7s} {'ratio':>6s}" if cudnn else ""))
    for label in PREFILL_FLOPS:
        if label not in ours_p:
            continue
        fl, mine = prefill_flops(label), ours_p[label]
        line = f"{label:>18s} {mine:9.1f} {fl / mine / 1e6:7.1f}"
        if label in fi_pre:
            variant, fi_us = fi_pre[label]
            ratios.append(("prefill " + label, fi_us / mine))
            line += f" {variant:>7s} {fi_us:9.1f} {fl / fi_us / 1e6:7.1f} {fi_us / mine:6.3f}"
        else:
            line += f" {'-':>7s} {'-':>9s} {'-':>7s} {'-':>6s}"
        if base_p:
            base = base_p.get(label)
            line += f" {base:9.1f} {fi_pre[label][1] / base:6.3f}" \
                if base and label in fi_pre else f" {'-':>9s} {'-':>6s}"
        if cudnn:
            row = cudnn.get(label, {})
            if "time_us" in row:
                ratios.append(("cudnn " + label, row["time_us"] / mine))
                line += f" {row['time_us']:9.1f} {row['TFLOPs']:7.1f} {row['time_us'] / mine:6.3f}"
            else:
                line += f" {'n/a':>9s} {'-':>7s} {'-':>6s}"
        print(line)
    for label, row in cudnn.items():  # how cuDNN ran each shape, or why it could not
        print(f"  cuDNN {label}: " + "; ".join(row.get("tried", [])))


def main():
    out = sys.argv[1]
    fi = json.loads(read(os.path.join(out, "flashinfer.txt.json")) or '{"rows": []}')
    fi_dec, fi_pre = peer_best(fi["rows"], "decode"), peer_best(fi["rows"], "prefill")
    ours_d = our_decode(read(os.path.join(out, "ours_decode.txt")))
    base_d = our_decode(read(os.path.join(out, "baseline_decode.txt")))
    ours_p = our_prefill(read(os.path.join(out, "ours_prefill.txt")))
    base_p = our_prefill(read(os.path.join(out, "baseline_prefill.txt")))
    header = [line for line in fi.get("header", [])[:1]]
    print("\n".join(header))
    ratios = []

    print("\ndecode, bf16 KV (ratio = FlashInfer best time / ours; TB/s = (K+V + q + out) / time)")
    cols = f"{'shape':>10s} {'splits':>6s} {'ours_us':>9s} {'TB/s':>5s} {'FI best':>9s} " \
           f"{'FI_us':>9s} {'TB/s':>5s} {'ratio':>6s}"
    print(cols + (f" {'base_us':>9s} {'ratio':>6s}" if base_d else ""))
    for shape, (variant, fi_us) in fi_dec.items():
        mine = ours_d.get(("bf16", "mma", shape))
        if mine is None:
            continue
        nb = decode_bytes(shape)
        ratio = fi_us / mine[0]
        ratios.append(("decode " + shape, ratio))
        line = f"{shape:>10s} {mine[1]:6d} {mine[0]:9.1f} {nb / mine[0] / 1e6:5.2f} {variant:>9s} " \
               f"{fi_us:9.1f} {nb / fi_us / 1e6:5.2f} {ratio:6.3f}"
        base = base_d.get(("bf16", "mma", shape))
        if base is not None:
            line += f" {base[0]:9.1f} {fi_us / base[0]:6.3f}"
        print(line)

    print("\ndecode, 1-byte KV: ours, % of 4.3 TB/s (KV bytes incl. int8 scales + q + o + lse)")
    print(f"{'shape':>10s} {'bf16':>6s} {'fp8':>6s} {'int8':>6s}" +
          (f" {'base bf16':>9s} {'fp8':>6s} {'int8':>6s}" if base_d else ""))
    for shape in sorted({k[2] for k in ours_d if k[0] == "int8" and k[1] == "mma"},
                        key=lambda s: tuple(int(x) for x in s.split("x"))):
        def pct(rows, dtype):
            r = rows.get((dtype, "mma", shape))
            return f"{r[2]:6.1f}" if r else f"{'-':>6s}"
        line = f"{shape:>10s} {pct(ours_d, 'bf16')} {pct(ours_d, 'fp8_e4m3')} {pct(ours_d, 'int8')}"
        if base_d:
            line += f" {pct(base_d, 'bf16'):>9s} {pct(base_d, 'fp8_e4m3')} {pct(base_d, 'int8')}"
        print(line)

    prefill_table(ours_p, base_p, fi_pre, read_cudnn(out), ratios)

    if not ratios:
        print("\nno shape measured by both (see the logs in " + out + ")")
        return 1
    vs_fi = [(name, r) for name, r in ratios if not name.startswith("cudnn ")]
    below = [name for name, r in vs_fi if r < 1.0]
    print(f"\n{len(vs_fi)} shapes vs FlashInfer, ratio {min(r for _, r in vs_fi):.3f}-"
          f"{max(r for _, r in vs_fi):.3f}; below 1.0: {', '.join(below) or 'none'}" if vs_fi else
          "\nno shape measured by FlashInfer")
    dnn = [(name[6:], r) for name, r in ratios if name.startswith("cudnn ")]
    if dnn:
        below = [f"{name} {r:.3f}" for name, r in dnn if r < 0.95]
        print(f"{len(dnn)} prefill shapes vs cuDNN, ratio {min(r for _, r in dnn):.3f}-"
              f"{max(r for _, r in dnn):.3f}; below 0.95: {', '.join(below) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
