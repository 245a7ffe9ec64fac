#!/usr/bin/env bash
# Speculative decoding in a CUDA TP=2 group (issue 34): `generate --backend=cuda --tp=2` with a
# draft model (rank 0 runs the draft whole on its own device; the group verifies) and with
# n-gram drafts, on golden fixtures (tests/golden/fixtures), K = 3, fixed length
# (--speculative_adaptive=false: every step verifies what the drafter found). Per fixture:
#   * TP=1 and TP=2 without speculation (the reference runs; TP=2 by the CUDA golden rule,
#     cuda_golden_lib.sh compare, against TP=1 and transformers);
#   * draft = the fixture itself (llama_f32_gqa, qwen2_f32): greedy tokens equal to TP=2 without
#     speculation, prompt by prompt; drafted > 0 and at least 90% of the drafts accepted (the
#     draft is the target in bf16 at TP=1; only a bf16 near-tie between TP=1 and TP=2 may
#     reject); the same run's logits by the golden rule against TP=1 and transformers;
#   * n-gram (every fixture; llama_f32_llama3_tied repeats itself): tokens equal to TP=2
#     without speculation, drafted > 0 (accepted printed);
#   * greedy tokens against TP=1 printed (bf16 TP=2 may round a near-tie the other way).
# The fixtures run as parallel chains on the same GPUs.
#
#   tests/gpu/spec_tp_cuda_golden.sh BUNDLE_DIR LOG_DIR
#
# BUNDLE_DIR: tests/gpu/bundle.sh with tool//runtime:generate. SHARE="" (the default here) puts
# rank r on GPU r, the collectives over NCCL (needs 2 GPUs); SHARE=--tp_share_device runs both
# ranks on GPU 0. Run from the repository root. Prints "N passed, N failed, N skipped".
set -uo pipefail
export SHARE=${SHARE-}
source "$(dirname "${BASH_SOURCE[0]}")/cuda_golden_lib.sh"
export NCCL_NVLS_ENABLE=0

FIXED=(--speculative_adaptive=false --num_speculative_tokens=3)
# counters ERR_FILE MIN_PERCENT: prints generate's speculative counters; drafted > 0 and
# accepted >= MIN_PERCENT % of drafted.
counters() {
  local line drafted accepted
  line=$(grep -o "drafted [0-9]*, accepted [0-9]*" "$1") || { echo "no speculative counters"; return 1; }
  read -r drafted accepted <<< "$(echo "$line" | tr -dc '0-9 ' | tr -s ' ')"
  grep -o 'speculative: .*' "$1"
  ((drafted > 0 && accepted * 100 >= drafted * $2))
}

# chain FIXTURE DRAFT(0|1): every row of one fixture; its verdict lines go to $LOG/FIXTURE.txt.
chain() {
  local v=$1 fix=tests/golden/fixtures/$1 draft=$2 prompts out=$LOG/$1
  prompts=$(prompts_of "$fix/expected.json")
  local args=(--model="$fix" --prompt_ids="$prompts")
  # shellcheck disable=SC2086 # SHARE: flags, split
  if ! run "$out.tp1.jsonl" "${args[@]}" || ! run "$out.tp2.jsonl" "${args[@]}" --tp=2 $SHARE; then
    fail "$v-reference" "$out".tp*.jsonl.err
    return
  fi
  if compare "$v-tp2" "$out.tp2.jsonl" "$out.tp1.jsonl" "$fix/expected.json"; then
    pass "$v-tp2"
  else
    fail "$v-tp2" "$out.tp2.jsonl.err"
  fi
  local rows=(ngram) row
  ((draft)) && rows=(draft ngram)
  for row in "${rows[@]}"; do
    local flags=(--speculative_method=ngram) min=0
    [[ $row == draft ]] && flags=(--speculative_method=draft --draft_model="$fix") min=90
    # shellcheck disable=SC2086 # SHARE: flags, split
    if run "$out.tp2-$row.jsonl" "${args[@]}" "${flags[@]}" "${FIXED[@]}" --tp=2 $SHARE &&
      same_tokens "$v TP=2 $row K=3 vs TP=2 off" "$out.tp2-$row.jsonl" "$out.tp2.jsonl" &&
      counters "$out.tp2-$row.jsonl.err" "$min" &&
      compare "$v-tp2-$row" "$out.tp2-$row.jsonl" "$out.tp1.jsonl" "$fix/expected.json"; then
      pass "$v-tp2-$row"
    else
      fail "$v-tp2-$row" "$out.tp2-$row.jsonl.err"
    fi
  done
  same_tokens "$v TP=2 off vs TP=1 (printed, not required)" "$out.tp2.jsonl" "$out.tp1.jsonl"
  echo "$v: $passed passed, $failed failed"
}

pids=() names=()
for entry in llama_f32_gqa:1 qwen2_f32:1 llama_f32_llama3_tied:0; do
  chain "${entry%%:*}" "${entry##*:}" > "$LOG/${entry%%:*}.txt" 2>&1 &
  pids+=($!) names+=("${entry%%:*}")
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  cat "$LOG/${names[$i]}.txt"
  p=$(grep -c '^PASS ' "$LOG/${names[$i]}.txt") f=$(grep -c '^FAIL ' "$LOG/${names[$i]}.txt")
  passed=$((passed + p)) failed=$((failed + f))
done
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed == 0 && $passed -gt 0 ]]
