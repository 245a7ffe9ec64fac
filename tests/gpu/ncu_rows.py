#!/usr/bin/env python3
"""One table row per kernel from ncu's text reports (the sections attention_call_lib.sh's
NCU_SECTIONS asks for): time, DRAM read bandwidth, L2 hit rate, grid, waves, issue rate and the
top stalls, as kernels/attention/cuda/BENCHMARKS.md's ncu tables print them.

  ncu_rows.py [--every] [--flops=LABEL:FLOP,...] LABEL=NCU_LOG [LABEL=NCU_LOG ...]

A log may hold several profiled launches: a kernel whose name has "Merge" belongs to the launch
before it (a split-KV decode's merge), and of each other kernel name the last launch is shown
(the warm one when a run profiles a first call too). A log without kernels prints why.
--every: every profiled launch, numbered (LABEL #N), in launch order, plus two columns: the
tensor pipes' utilisation (any sm__pipe_tensor_op_*_cycles_active pct metric the log holds) and,
where --flops gives LABEL's useful FLOP count (a prefill shape's causal work), TFLOP/s over the
launch's duration.
"""
import re
import sys

HEADER = re.compile(r"^\s*(?:void )?(.+?) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), "
                    r"Context \d+, Stream \d+")
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio")
SCALE = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6, "nsecond": 1e-3, "usecond": 1.0,
         "msecond": 1e3, "second": 1e6}  # -> us; bandwidths -> TB/s:
SCALE.update({f"{p}{b}/{t}": f for p, f in (("", 1e-12), ("K", 1e-9), ("M", 1e-6), ("G", 1e-3),
                                             ("T", 1.0)) for b in ("byte", "B") for t in ("s", "second")})


def short_name(name):
    """'void ns::(anonymous namespace)::Kernel<T, ...>(args)' -> 'Kernel'."""
    name = name.split("<")[0].replace("(anonymous namespace)", "").split("(")[0]
    return name.split("::")[-1].strip()


def parse(text):
    """[{"name", "grid", "block", metrics...}] in launch order."""
    kernels = []
    for line in text.splitlines():
        m = HEADER.match(line)
        if m:
            grid = int(m.group(2)) * int(m.group(3)) * int(m.group(4))
            block = int(m.group(5)) * int(m.group(6)) * int(m.group(7))
            kernels.append({"name": short_name(m.group(1)), "grid": grid, "block": block, "m": {}})
            continue
        if not kernels or not line.startswith("    "):
            continue
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) not in (2, 3):
            continue
        try:
            value = float(cells[-1].replace(",", ""))
        except ValueError:
            continue
        unit = cells[1] if len(cells) == 3 else ""
        kernels[-1]["m"][cells[0]] = (value, unit)
    return kernels


def groups(kernels):
    """{main kernel name: [its last launch, the merges after it]} in first-seen order."""
    out, current = {}, None
    for k in kernels:
        if "Merge" in k["name"] and current is not None:
            current.append(k)
        else:
            current = [k]
            out[k["name"]] = current
    return out


def scaled(k, name):
    value, unit = k["m"].get(name, (None, ""))
    return None if value is None else value * SCALE.get(unit, 1.0)


def fmt(value, spec, missing="-"):
    return missing if value is None else format(value, spec)


def row(label, k):
    m = k["m"]
    us = scaled(k, "Duration")
    tbs = scaled(k, "dram__bytes_read.sum.per_second")
    dram_pct = m.get("DRAM Throughput", (None,))[0]
    l2 = m.get("lts__t_sector_hit_rate.pct", m.get("L2 Hit Rate", (None,)))[0]
    stalls = sorted(((v[0], s.group(1).replace("_", " ")) for n, v in m.items()
                     for s in [STALL.fullmatch(n)] if s and s.group(1) != "selected"),
                    reverse=True)[:3]
    occ = m.get("Achieved Occupancy", (None,))[0]
    regs = m.get("Registers Per Thread", (None,))[0]
    cells = [
        f"{label} {k['name']}", fmt(us, ".1f"),
        f"{fmt(tbs, '.2f')} ({fmt(dram_pct, '.1f')}%)", f"{fmt(l2, '.1f')}%",
        f"{k['grid']} x {k['block']}, {fmt(regs, '.0f')} regs, {fmt(occ, '.1f')}% occ, "
        f"{fmt(m.get('Waves Per SM', (None,))[0], '.2f')} waves",
        fmt(m.get("Issued Warp Per Scheduler", (None,))[0], ".2f"),
        fmt(m.get("Warp Cycles Per Issued Instruction", (None,))[0], ".2f"),
        ", ".join(f"{name} {v:.2f}" for v, name in stalls) or "-",
    ]
    return "| " + " | ".join(cells) + " |"


def load(label, path, tail):
    """The log's kernels (parse), or None after printing a row that says why there are none."""
    try:
        with open(path, errors="replace") as f:
            kernels = parse(f.read())
    except OSError as e:
        print(f"| {label}: no log ({e.strerror}) {tail}")
        return None
    if not kernels:
        print(f"| {label}: no kernel profiled (see {path}) {tail}")
    return kernels


PIPE = re.compile(r"sm__pipe_tensor_op_(\w+?)_cycles_active\.avg\.pct_of_peak_sustained_active")


def extra_cells(k, flop):
    """--every's two cells: tensor pipe % per pipe name, TFLOP/s from flop (or None)."""
    pipes = [f"{p.group(1)} {v[0]:.1f}%" for n, v in k["m"].items() for p in [PIPE.fullmatch(n)]
             if p]
    us = scaled(k, "Duration")
    tflops = flop / us * 1e-6 if flop and us else None
    return [", ".join(pipes) or "-", fmt(tflops, ".1f")]


def main_every(args):
    flops = {}
    rows = [a for a in args if not a.startswith("--")]
    for a in args:
        if a.startswith("--flops="):
            for item in a[len("--flops="):].split(","):
                label, value = item.rsplit(":", 1)
                flops[label] = float(value)
    print("| kernel, shape | us | DRAM read TB/s (DRAM % of peak) | L2 hit | grid x block, "
          "regs, occupancy, waves | issued / sched / cycle | cycles per issue | top stalls "
          "(cycles per issued instruction) | tensor pipe (% of peak) | TFLOP/s |")
    print("| --- | ---: | --- | ---: | --- | ---: | ---: | --- | --- | ---: |")
    for arg in rows:
        label, path = arg.split("=", 1)
        kernels = load(label, path, "|")
        for i, k in enumerate(kernels or []):
            cells = extra_cells(k, flops.get(label))
            print(row(f"{label} #{i}", k) + " " + " | ".join(cells) + " |")
    return 0


def main():
    if "--every" in sys.argv[1:]:
        return main_every(sys.argv[1:])
    if len(sys.argv) < 2 or any("=" not in a for a in sys.argv[1:]):
        print(__doc__, file=sys.stderr)
        return 2
    print("| kernel, shape | us | DRAM read TB/s (DRAM % of peak) | L2 hit | grid x block, "
          "regs, occupancy, waves | issued / sched / cycle | cycles per issue | top stalls "
          "(cycles per issued instruction) |")
    print("| --- | ---: | --- | ---: | --- | ---: | ---: | --- |")
    for arg in sys.argv[1:]:
        label, path = arg.split("=", 1)
        kernels = load(label, path, "| | | | | | | |")
        for launches in groups(kernels or []).values():
            for i, k in enumerate(launches):
                print(row(label if i == 0 else f"{label} +", k))
    return 0


if __name__ == "__main__":
    sys.exit(main())
