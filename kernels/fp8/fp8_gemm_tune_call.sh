#!/usr/bin/env bash
# The timed cuBLASLt algorithm choice of the FP8 and bf16 GEMMs (CublasLtFp8Gemm /
# CublasLtGemm::set_autotune_max_m, kernels/gemm/cuda/cublaslt_algo_tuner.h) in one device call
# on nvidia-h200, from the repository root, ~2 minutes:
#   OUT=DIR kernels/fp8/fp8_gemm_tune_call.sh BUNDLE_DIR
# BUNDLE_DIR (unpacked): tests/gpu/bundle.sh BUNDLE_DIR //kernels/fp8:fp8_gemm_cuda_test
#   //kernels/gemm/cuda:gemm_cuda_test //kernels/gemm/cuda:cublaslt_algo_tuner_test
#   //kernels/fp8:fp8_cuda_bench
# Steps, each under its own timeout, logs under $OUT/logs:
#   1. fp8_gemm_cuda_test (the tuned cases, per-tensor / token x channel / block) and
#      gemm_cuda_test (bf16, its autotune case included), cublaslt_algo_tuner_test;
#   2. fp8_cuda_bench --only=gemm: per Llama-3 8B / 70B shape and M = 1k / 4k / 16k, bf16,
#      per-tensor, token x channel and block FP8 each with cuBLASLt's first heuristic algorithm
#      and tuned;
#   3. kernels/fp8/scaled_mm_bench.py right after it on the same GPU (torch._scaled_mm);
#   4. the join: tuned / _scaled_mm per row (per-tensor, row-wise), heuristic-first / _scaled_mm,
#      tuned block / tuned per-tensor, with the issue's targets (>= 0.95, >= 0.9) counted.
set -uo pipefail
T0=$SECONDS
B=$(realpath "${1:?bundle dir}")
OUT=${OUT:-/tmp/fp8_gemm_tune_out}
LOG=$OUT/logs
mkdir -p "$LOG"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64"
ITERS=${ITERS:-20}
nvidia-smi -L > "$LOG/gpus.txt" 2>&1 || echo "no GPU (nvidia-smi failed)"
echo "== device: $(head -n 1 "$LOG/gpus.txt")"

check() {  # NAME RC
  if [[ $2 == 0 ]]; then echo "PASS $1"; else echo "FAIL $1 (rc $2)"; fi
}

timeout 120 "$B/bin/kernels/fp8/fp8_gemm_cuda_test" \
  --gtest_filter='*Tuned*:*Tuning*:*PerTensor*:*TokenChannel*:*OuterVector*:*Block128Matches*' \
  > "$LOG/fp8_gemm_cuda_test.txt" 2>&1
check "fp8_gemm_cuda_test (tuned, per-tensor, token x channel, block)" $?
grep -hE "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|^\[       OK \]|timed|largest error" \
  "$LOG/fp8_gemm_cuda_test.txt" | head -30
timeout 60 "$B/bin/kernels/gemm/cuda/gemm_cuda_test" > "$LOG/gemm_cuda_test.txt" 2>&1
check "gemm_cuda_test (bf16)" $?
grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$LOG/gemm_cuda_test.txt" | head -10
timeout 30 "$B/bin/kernels/gemm/cuda/cublaslt_algo_tuner_test" > "$LOG/tuner_test.txt" 2>&1
check "cublaslt_algo_tuner_test" $?
echo "tests done at $((SECONDS - T0)) s"

timeout 150 "$B/bin/kernels/fp8/fp8_cuda_bench" --only=gemm --gemm_iters="$ITERS" \
  > "$LOG/bench.txt" 2>&1
check "fp8_cuda_bench --only=gemm" $?
echo "bench done at $((SECONDS - T0)) s"
timeout 90 python3 kernels/fp8/scaled_mm_bench.py --iters "$ITERS" > "$LOG/scaled_mm.txt" 2>&1
check "scaled_mm_bench.py" $?
echo "torch done at $((SECONDS - T0)) s"
echo "== fp8_cuda_bench --only=gemm"
cat "$LOG/bench.txt"
echo "== scaled_mm_bench.py"
cat "$LOG/scaled_mm.txt"

python3 - "$LOG/bench.txt" "$LOG/scaled_mm.txt" <<'PY'
import math, sys

def rows(path, width):
    out = {}
    for line in open(path):
        f = line.split()
        if len(f) >= width + 2 and "." in f[0] and f[1].isdigit():
            try:
                out[(f[0], int(f[1]))] = [float(x) for x in f[2:2 + width]]
            except ValueError:
                pass
    return out

ours = rows(sys.argv[1], 8)   # bf16 f/t, tensor f/t, channel f/t, block f/t (TFLOP/s)
torch = rows(sys.argv[2], 3)  # torch bf16, _scaled_mm tensor, _scaled_mm row-wise
def ratio(a, b):
    return a / b if a > 0 and b > 0 else float("nan")
print("== join: shape M | tensor tuned/sm, first/sm | channel tuned/sm_rowwise, first/sm_rowwise"
      " | bf16 tuned/torch, first/torch | block tuned/tensor tuned, block first/tensor first")
cols = {k: [] for k in ("tt", "tf", "ct", "cf", "bt", "bf", "blt", "blf")}
for key in ours:  # the bench's order
    o = ours[key]
    t = torch.get(key)
    if t is None:
        print(f"{key[0]} {key[1]}: no torch row")
        continue
    r = dict(tt=ratio(o[3], t[1]), tf=ratio(o[2], t[1]), ct=ratio(o[5], t[2]),
             cf=ratio(o[4], t[2]), bt=ratio(o[1], t[0]), bf=ratio(o[0], t[0]),
             blt=ratio(o[7], o[3]), blf=ratio(o[6], o[2]))
    for k, v in r.items():
        cols[k].append(v)
    mark = "" if r["tt"] >= 0.95 else " **"
    print(f"{key[0]} {key[1]} | {r['tt']:.3f} {r['tf']:.3f} | {r['ct']:.3f} {r['cf']:.3f} | "
          f"{r['bt']:.3f} {r['bf']:.3f} | {r['blt']:.3f} {r['blf']:.3f}{mark}")

def summary(name, vals, target):
    vals = [v for v in vals if not math.isnan(v)]
    if not vals:
        print(f"{name}: no rows")
        return
    geo = math.exp(sum(math.log(v) for v in vals) / len(vals))
    met = sum(v >= target for v in vals)
    print(f"{name}: {min(vals):.3f}-{max(vals):.3f}, geomean {geo:.3f}, "
          f">= {target}: {met} of {len(vals)}")

summary("per-tensor tuned / _scaled_mm", cols["tt"], 0.95)
summary("per-tensor first / _scaled_mm", cols["tf"], 0.95)
summary("token x channel tuned / _scaled_mm row-wise", cols["ct"], 0.95)
summary("token x channel first / _scaled_mm row-wise", cols["cf"], 0.95)
summary("bf16 tuned / torch bf16", cols["bt"], 0.95)
summary("bf16 first / torch bf16", cols["bf"], 0.95)
summary("block tuned / per-tensor tuned", cols["blt"], 0.9)
summary("block first / per-tensor first", cols["blf"], 0.9)
PY
echo "total $((SECONDS - T0)) s"
