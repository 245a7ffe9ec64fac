#!/usr/bin/env bash
# step_trace_summary.py on a synthetic worker step trace: 300 decode steps of two sequences
# (3,000 us each, 50 us apart) with a prompt chunk folded into every 50th step (40,000 us). The
# step table counts both kinds with their times, and the slowest 1% of token intervals are the
# steps that carried prompt tokens.
#
#   step_trace_summary_test.sh STEP_TRACE_SUMMARY_PY
set -uo pipefail
PY=$1
TMP=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; cat "$TMP/out.txt" >&2; exit 1; }
python3 - "$TMP/steps.jsonl" "$TMP/requests.jsonl" <<'PYEOF'
import json, sys
t = 0
with open(sys.argv[1], "w") as f:
    for i in range(300):
        mixed = i % 50 == 49
        us = 40000 if mixed else 3000
        f.write(json.dumps({"step": i + 1, "t_us": t, "step_us": us, "gap_us": 50, "seqs": 3 if mixed else 2,
                            "decode": 2, "prefill_tokens": 512 if mixed else 0, "draft_tokens": 0,
                            "tokens": 514 if mixed else 2, "running": 2, "waiting": 0}) + "\n")
        t += us + 50
    f.write('{"truncated_after":300}\n')
with open(sys.argv[2], "w") as f:
    f.write(json.dumps({"itl_ms": [3.05] * 98 + [40.05] * 2}) + "\n")
PYEOF
python3 "$PY" "$TMP/steps.jsonl" --requests="$TMP/requests.jsonl" > "$TMP/out.txt" 2>&1 ||
  fail "the summary exited $?"
grep -Eq '^decode b=2 +294 +3000 +3000 +3000 +3000$' "$TMP/out.txt" || fail "decode row"
grep -Eq '^prompt\+decode +6 +40000 +40000 +40000 +40000$' "$TMP/out.txt" || fail "prompt row"
grep -Eq '^token interval +598 +3050 +3050 +40050 +40050$' "$TMP/out.txt" || fail "interval row"
grep -Eq '^  prompt\+decode +after decode b=2 +100.0%$' "$TMP/out.txt" || fail "tail attribution"
grep -Eq '^client ITL +100 +3050 +3050 +40050 +40050$' "$TMP/out.txt" || fail "client row"
echo PASS
