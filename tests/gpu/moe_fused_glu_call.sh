#!/usr/bin/env bash
# Issue 32: serving's fused gate_up + SiLU (CudaMoeKernels::fused_glu, MoeGroupedWgmmaGateUpSilu)
# in one device call on nvidia-h200 (one GPU), from the repository root:
#   tests/gpu/moe_fused_glu_call.sh BUNDLE_DIR
# BUNDLE_DIR: tests/gpu/bundle.sh DIR //kernels/moe:moe_cuda_layer_test
#   //runtime/cuda:cuda_moe_mlp_test //kernels/moe:moe_cuda_bench tool//runtime:generate; optional
#   bin/kernels/moe/moe_cuda_bench_2de8882 (moe_cuda_bench's link with moe_grouped_wgmma_cuda.cu
#   compiled from 2de8882's sources, whose fusion was a runtime flag: the A/B of the unfused
#   kernel). Steps, each under its own timeout (~2 min on an H200 in all; the A/B only if started
#   within 65 s, ncu within 110 s):
#   layer_test   moe_cuda_layer_test (the kernels against fp64 / the CPU layer, fused included);
#   mlp_test     cuda_moe_mlp_test (CudaMoeMlp fused vs unfused: bit-equal, both vs the CPU);
#   bench        moe_cuda_bench --tokens=1024,4096,8192 --iters=20 --variants=0: wg_ms (unfused
#                gate_up + MoeSiluAndMul) and glu_ms (fused) columns, Qwen3-30B-A3B and Mixtral;
#   bench_2de8882, bench_again: with the 2de8882 binary, it and this one again at 4,096 / 8,192;
#   e2e          generate, Qwen3-30B-A3B dummy, one 1,100-token prefill (prompts of 800 + 300),
#                8 greedy tokens, default (fused) vs TANDEM_MOE_KERNELS without fused_glu:
#                tokens and last-prompt logits must be equal;
#   ncu          (if there, and time left) the fused run's first two GroupedWgmmaKernel launches
#                by name (kGlu, the last template argument, true for gate_up).
# Logs under $OUT/fused_glu (tarred to $OUT/fused_glu.tar.gz); the summary to stdout.
set -uo pipefail
T0=$SECONDS
export OUT=${OUT:-/tmp/moe_fused_glu_out} TANDEM_REQUIRE_GPU=1
# shellcheck source-path=SCRIPTDIR source=device_call_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/device_call_lib.sh"
device_call_start "$(cd "${1:?bundle dir}" && pwd)" "$OUT/fused_glu"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
device_line
K=$B/bin/kernels/moe
failed=()
# results NAME: the test's verdict lines; NAME counts as failed unless it exited 0.
results() {
  grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) |tokens \(|checked" "$LOG/$1.txt"
  ((step_rc == 0)) || failed+=("$1")
}

step layer_test 60 "$K/moe_cuda_layer_test"
results layer_test
step mlp_test 40 "$B/bin/runtime/cuda/cuda_moe_mlp_test"
results mlp_test
BENCH=(--iters=20 --variants=0)
step bench 60 "$K/moe_cuda_bench" --tokens=1024,4096,8192 "${BENCH[@]}"
grep -E "^(Mixtral|Qwen3)|^ +[0-9]" "$LOG/bench.txt" | cut -c1-400
if [[ -x $K/moe_cuda_bench_2de8882 ]] && ((SECONDS - T0 < 65)); then
  step bench_2de8882 35 "$K/moe_cuda_bench_2de8882" --tokens=4096,8192 "${BENCH[@]}"
  step bench_again 35 "$K/moe_cuda_bench" --tokens=4096,8192 "${BENCH[@]}"
  for f in bench_2de8882 bench_again; do
    echo "-- $f"
    grep -E "^(Mixtral|Qwen3)|^ +[0-9]" "$LOG/$f.txt" | cut -c1-400
  done
fi

# The end-to-end pair: greedy tokens and last-prompt logits of one 1,100-token prefill step.
ids() {
  python3 -c "import random; r = random.Random($2); print(','.join(str(r.randrange(3, 500)) for _ in range($1)))"
}
Q=(--backend=cuda --load_format=dummy --dummy_config=qwen3-30b-a3b --max_num_seqs=2
  --cuda_graphs=false --max_tokens=8 --ignore_eos --dump_last_logits --num_threads=8
  "--prompt_ids=$(ids 800 1);$(ids 300 2)")
G=$B/bin/runtime/generate
step e2e_fused 45 env -u TANDEM_MOE_KERNELS "$G" "${Q[@]}"
((step_rc == 0)) || tail -n 3 "$LOG/e2e_fused.txt"
step e2e_unfused 45 env TANDEM_MOE_KERNELS=split_combine,mma_grouped,fused_route,pdl,wgmma_grouped \
  "$G" "${Q[@]}"
((step_rc == 0)) || tail -n 3 "$LOG/e2e_unfused.txt"
e2e=FAIL
if python3 - "$LOG/e2e_fused.txt" "$LOG/e2e_unfused.txt" <<'PY'; then
import json, sys
runs = [[json.loads(l) for l in open(f) if l.startswith("{")] for f in sys.argv[1:3]]
assert len(runs[0]) == len(runs[1]) == 2, [len(r) for r in runs]
ok = True
for i, (f, u) in enumerate(zip(*runs)):
    a, b = f["last_prompt_logits"], u["last_prompt_logits"]
    diff = max(abs(x - y) for x, y in zip(a, b))
    same = f["tokens"] == u["tokens"] and len(a) == len(b) and diff == 0
    ok &= same
    print(f"prompt {i}: tokens {f['tokens']} vs {u['tokens']}, max |logit diff| {diff}")
sys.exit(0 if ok else 1)
PY
  e2e=PASS
fi
echo "$e2e e2e fused vs unfused (tokens and last-prompt logits equal)"
[[ $e2e == PASS ]] || failed+=(e2e)
NCU=/usr/local/cuda/bin/ncu
if [[ -x $NCU ]] && ((SECONDS - T0 < 110)); then
  step ncu 30 "$NCU" --kernel-name regex:GroupedWgmma --launch-count 2 \
    --metrics gpu__time_duration.sum "$G" "${Q[@]}"
  grep -E "GroupedWgmmaKernel|gpu__time_duration" "$LOG/ncu.txt" | cut -c1-200
fi
tar czf "$OUT/fused_glu.tar.gz" -C "$OUT" fused_glu
echo "== total wall $((SECONDS - T0)) s; failed: ${failed[*]:-none}"
((${#failed[@]} == 0))
