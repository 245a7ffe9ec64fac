#!/usr/bin/env bash
# A worker group's rank dying or wedging mid-generation: `generate --tp=2` (llama-100m shapes,
# dummy weights, a long greedy run) with rank 1 SIGKILLed must exit 1 with UNAVAILABLE within
# 5 s; with rank 1 SIGSTOPped it must exit 1 with DEADLINE_EXCEEDED once --dist_timeout_s (3 s)
# passes. Either way no rank process is left behind. Only processes this test started are
# signalled.
set -euo pipefail
GENERATE=$1
T=${TEST_TMPDIR:-$(mktemp -d)}

fault() {  # SIGNAL EXPECTED_CODE LIMIT_S
  local sig=$1 code=$2 limit=$3
  "$GENERATE" --load_format=dummy --dummy_config=llama-100m --prompt_ids="5,6,7;8,9" \
    --max_tokens=1500 --ignore_eos --tp=2 --num_threads=1 --dist_timeout_s=3 \
    > "$T/out" 2> "$T/err" &
  local gen=$!
  ( sleep 120; kill -KILL "$gen" 2> /dev/null ) &  # bound: never outlive the test
  local watchdog=$!
  # Wait until both ranks run steps (rank 0 logged the group; give the load time to finish).
  local rank1=""
  for _ in $(seq 1 200); do
    rank1=$(pgrep -P "$gen" || true)
    grep -q "worker group: tp=2" "$T/err" 2> /dev/null && [[ -n $rank1 ]] && break
    sleep 0.1
  done
  [[ -n $rank1 ]] || { echo "FAIL: rank 1 never started"; cat "$T/err"; exit 1; }
  sleep 2  # mid-generation
  kill -0 "$gen" || { echo "FAIL: generation ended before the fault"; cat "$T/err"; exit 1; }
  local start=$SECONDS
  kill "-$sig" "$rank1"
  local rc=0
  wait "$gen" || rc=$?
  local took=$((SECONDS - start))
  kill "$watchdog" 2> /dev/null || true
  [[ $rc == 1 ]] || { echo "FAIL: SIG$sig: exit $rc"; cat "$T/err"; exit 1; }
  grep -q "$code" "$T/err" || { echo "FAIL: SIG$sig: no $code in:"; tail -5 "$T/err"; exit 1; }
  (( took <= limit )) || { echo "FAIL: SIG$sig: took ${took}s > ${limit}s"; exit 1; }
  sleep 0.5
  if kill -0 "$rank1" 2> /dev/null; then
    echo "FAIL: SIG$sig: rank 1 ($rank1) still exists"; kill -KILL "$rank1"; exit 1
  fi
  echo "ok: SIG$sig of rank 1 -> exit 1 with $code after ${took}s; no rank left: $(grep "$code" "$T/err" | head -1 | cut -c1-160)"
}

fault KILL UNAVAILABLE 5
fault STOP DEADLINE_EXCEEDED 8
echo PASS
