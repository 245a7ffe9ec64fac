#!/usr/bin/env bash
# MoeGroupedWgmma in real model steps (issue 32): CudaMoeMlp takes it by default on sm_90 for
# E > 16 and steps of more than 256 tokens (CudaMoeKernels::wgmma_grouped). Greedy, 8 tokens each:
#   * Qwen3-30B-A3B (--load_format=dummy --dummy_config=qwen3-30b-a3b, 128 experts) on two
#     prompts of 800 + 300 tokens (one 1,100-token prefill step): the default kernels against
#     TANDEM_MOE_KERNELS=old (cuBLAS's grouped GEMM) and against the default less wgmma_grouped
#     (MoeGroupedMma), CUDA graphs on; the default and old again with --cuda_graphs=false. Tokens
#     must be equal; the last-prompt logits' max |difference| is printed;
#   * a small Qwen3-MoE with 32 experts (tests/gpu/configs/qwen3-moe-32e, dummy weights) on the
#     CPU and on the GPU (default and old), prompts of 600 + 40 tokens: logits cosine to the CPU
#     >= 0.999 and the first token equal to the CPU's where its top-2 gap is >= 3% of max|logit|;
#   * where the machine has ncu: the default Qwen3-30B-A3B run again under ncu, its first two
#     MoeGroupedWgmma launches named with their durations (every path above gives the same bits,
#     so this shows which kernel ran).
#
#   tests/gpu/moe_wgmma_e2e.sh BUNDLE_DIR LOG_DIR [SECONDS]
#
# BUNDLE_DIR: tests/gpu/bundle.sh with tool//runtime:generate; run from the repository root. A run
# not started within SECONDS (default 150) of the start is skipped (the device call's budget).
# Prints one PASS / FAIL / SKIP line per check and "N passed, N failed, N skipped".
set -uo pipefail
B=$(cd "${1:?bundle dir}" && pwd)
LOG=${2:?log dir}
BUDGET=${3:-150}
mkdir -p "$LOG"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
G=$B/bin/runtime/generate
T0=$SECONDS
passed=0 failed=0 skipped=0

# ids N SEED: N token ids in [3, 500) (every vocabulary here has 512 or more).
ids() {
  python3 -c "import random; r = random.Random($2); print(','.join(str(r.randrange(3, 500)) for _ in range($1)))"
}

# gen NAME KERNELS ARGS...: generate into $LOG/NAME.jsonl with TANDEM_MOE_KERNELS=KERNELS
# ("default": unset). Returns 2 (skipped) past the budget.
gen() {
  local name=$1 kernels=$2 t=$SECONDS rc
  shift 2
  if ((SECONDS - T0 > BUDGET)); then
    echo "== $name: not started (${BUDGET} s budget)"
    return 2
  fi
  local env=(env -u TANDEM_MOE_KERNELS)
  [[ $kernels != default ]] && env=(env "TANDEM_MOE_KERNELS=$kernels")
  "${env[@]}" timeout 45 "$G" --max_tokens=8 --ignore_eos --dump_last_logits --num_threads=8 \
    "$@" > "$LOG/$name.jsonl" 2> "$LOG/$name.err"
  rc=$?
  echo "== $name (TANDEM_MOE_KERNELS=$kernels): rc $rc in $((SECONDS - t)) s"
  ((rc == 0)) || tail -n 3 "$LOG/$name.err"
  return "$rc"
}

# check NAME OUT REF MODE: MODE "tokens" (greedy tokens equal) or "cpu" (the CPU rule above);
# both print the logits' cosine and max |difference| / max|logit|.
check() {
  if [[ ! -e $LOG/$2.jsonl || ! -e $LOG/$3.jsonl ]]; then
    echo "SKIP $1 (a run was not started)"
    skipped=$((skipped + 1))
    return
  fi
  if python3 - "$1" "$LOG/$2.jsonl" "$LOG/$3.jsonl" "$4" <<'PY'; then
import json, math, sys
name, out, ref, mode = sys.argv[1:5]
got = [json.loads(l) for l in open(out) if l.strip()]
want = [json.loads(l) for l in open(ref) if l.strip()]
assert len(got) == len(want) > 0
bad = 0
for i, (g, w) in enumerate(zip(got, want)):
    a, b = g["last_prompt_logits"], w["last_prompt_logits"]
    m = max(abs(x) for x in b)
    cos = sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
    diff = max(abs(x - y) for x, y in zip(a, b)) / m
    top = sorted(b, reverse=True)
    if mode == "tokens":
        ok = g["tokens"] == w["tokens"]
    else:
        ok = cos >= 0.999 and (top[0] - top[1] < 0.03 * m or g["tokens"][0] == w["tokens"][0])
    bad += not ok
    print(f"{name} prompt {i}: tokens {g['tokens']} vs {w['tokens']}, logits cosine {cos:.6f}, "
          f"max |diff| {diff:.2e} of max{'' if ok else '  <-- FAIL'}")
sys.exit(1 if bad else 0)
PY
    echo "PASS $1"
    passed=$((passed + 1))
  else
    echo "FAIL $1"
    failed=$((failed + 1))
  fi
}

P="$(ids 800 1);$(ids 300 2)"
# --max_num_seqs=2: decode graphs of batch 1 and 2 only (the call's time).
Q=(--backend=cuda --load_format=dummy --dummy_config=qwen3-30b-a3b --max_num_seqs=2
  --prompt_ids="$P")
S="$(ids 600 3);$(ids 40 4)"
C=(--load_format=dummy --dummy_config=tests/gpu/configs/qwen3-moe-32e --dummy_seed=5
  --prompt_ids="$S")
# Most wanted first: a run past the budget is skipped.
gen q_default default "${Q[@]}"
gen q_old old "${Q[@]}"
gen t_cpu default --backend=cpu "${C[@]}"
gen t_default default --backend=cuda "${C[@]}"
gen t_old old --backend=cuda "${C[@]}"
gen q_default_eager default "${Q[@]}" --cuda_graphs=false
gen q_mma split_combine,mma_grouped,fused_route,pdl "${Q[@]}"
gen q_old_eager old "${Q[@]}" --cuda_graphs=false
check qwen3-30b-a3b-default-vs-old q_default q_old tokens
check qwen3-moe-32e-default-vs-cpu t_default t_cpu cpu
check qwen3-moe-32e-old-vs-cpu t_old t_cpu cpu
check qwen3-30b-a3b-default-eager-vs-graphs q_default_eager q_default tokens
check qwen3-30b-a3b-wgmma-vs-mma q_default q_mma tokens
check qwen3-30b-a3b-old-eager-vs-graphs q_old_eager q_old tokens
NCU=/usr/local/cuda/bin/ncu
if [[ -x $NCU ]] && ((SECONDS - T0 <= BUDGET)); then
  t=$SECONDS
  timeout 60 "$NCU" --kernel-name regex:GroupedWgmma --launch-count 2 \
    --metrics gpu__time_duration.sum "$G" --max_tokens=8 --ignore_eos "${Q[@]}" \
    > "$LOG/ncu_q_default.txt" 2>&1
  echo "== ncu_q_default: rc $? in $((SECONDS - t)) s"
  grep -E "GroupedWgmmaKernel|gpu__time_duration" "$LOG/ncu_q_default.txt" | cut -c1-160
fi
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed == 0 ]]
