#!/usr/bin/env bash
# Runs a GPU bundle made by tests/gpu/bundle.sh. Needs only bash, coreutils, grep, awk, the
# NVIDIA driver and the CUDA 13 runtime libraries.
#
#   run.sh LOG_DIR [FILTER]
#
# FILTER (a grep -E pattern on the binary path) picks a subset; TANDEM_BUNDLE_SKIP_BENCH=1
# skips benchmarks. Per binary: LOG_DIR/<pkg>__<name>.log and a JUnit XML file (gtest's own for
# tests; a one-case file for benchmarks). GPU tests run with TANDEM_REQUIRE_GPU=1 unless set
# otherwise, so a missing device fails instead of skipping. Ends with one line
# "N passed, N failed, N skipped" (test cases; a benchmark counts as one) and exits non-zero on
# any failure.
set -uo pipefail

DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOG=${1:?usage: run.sh LOG_DIR [FILTER]}
FILTER=${2:-.}
mkdir -p "$LOG"
LOG=$(cd "$LOG" && pwd)

export LD_LIBRARY_PATH="$DIR/lib:${CUDA_HOME:-/usr/local/cuda}/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export TANDEM_REQUIRE_GPU=${TANDEM_REQUIRE_GPU:-1}

passed=0 failed=0 skipped=0
xml_count() { grep -o "$1" "$2" 2>/dev/null | wc -l; }

while read -r kind bin; do
  [[ -n "$kind" ]] || continue
  [[ $kind == tool ]] && continue  # staged for scripts, not run here
  echo "$bin" | grep -Eq -- "$FILTER" || continue
  if [[ $kind == bench && ${TANDEM_BUNDLE_SKIP_BENCH:-0} == 1 ]]; then continue; fi
  base=${bin#bin/}; base=${base//\//__}
  logf="$LOG/$base.log" xmlf="$LOG/$base.xml"
  echo "=== $kind $bin"
  start=$(date +%s.%N)
  if [[ $kind == test ]]; then
    "$DIR/$bin" --gtest_output="xml:$xmlf" > "$logf" 2>&1
    rc=$?
    cases=$(xml_count '<testcase ' "$xmlf")
    # A failed case is a <testcase> element holding at least one <failure>.
    fails=$(awk '/<testcase /{tc=1} /<failure /{if (tc) {n++; tc=0}} END{print n+0}' \
            "$xmlf" 2>/dev/null || echo 0)
    skips=$(( $(xml_count 'result="skipped"' "$xmlf") + $(xml_count 'status="notrun"' "$xmlf") ))
    if [[ $rc -ne 0 && $fails -eq 0 ]]; then fails=1; fi  # crashed before writing results
    passed=$((passed + cases - fails - skips)); failed=$((failed + fails)); skipped=$((skipped + skips))
    tail -n 3 "$logf"
  else
    "$DIR/$bin" > "$logf" 2>&1
    rc=$?
    cat "$logf"
    secs=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN{printf "%.3f", e-s}')
    {
      echo '<?xml version="1.0" encoding="UTF-8"?>'
      echo "<testsuites tests=\"1\" failures=\"$((rc != 0))\"><testsuite name=\"$base\" tests=\"1\" failures=\"$((rc != 0))\">"
      echo "<testcase name=\"$base\" time=\"$secs\">"
      [[ $rc -ne 0 ]] && echo "<failure message=\"exit code $rc\"/>"
      echo "</testcase></testsuite></testsuites>"
    } > "$xmlf"
    if [[ $rc -eq 0 ]]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
  fi
  echo "--- exit $rc"
done < "$DIR/manifest.txt"

echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
