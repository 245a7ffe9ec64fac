#!/usr/bin/env bash
# CI: a full rolling restart of a 2P+2D cluster (CPU backend, tiny dummy model) under steady
# tandem_bench load: every worker is drained and restarted once, no request fails and no KV
# read falls back to recompute (tests/bench/rolling_restart_bench.sh asserts both), and at
# least 20 requests were sent while workers were restarting.
#   args: tandem_worker tandem_router tandem_cli tandem_bench (their bazel locations)
set -euo pipefail
bin="$TEST_TMPDIR/bin"
mkdir -p "$bin/runtime" "$bin/router" "$bin/tests/bench"
ln -sf "$PWD/$1" "$bin/runtime/tandem_worker"
ln -sf "$PWD/$2" "$bin/router/tandem_router"
ln -sf "$PWD/$3" "$bin/router/tandem_cli"
ln -sf "$PWD/$4" "$bin/tests/bench/tandem_bench"
export TMPDIR="$TEST_TMPDIR"
timeout 240 tests/bench/rolling_restart_bench.sh --bin_dir="$bin" --prefill=2 --decode=2 \
  --dummy_config=tiny --rate=16 --prompt_len=32:128 --output_len=16:48 --before_s=4 \
  --after_s=3 --settle_s=1 --run_dir="$TEST_TMPDIR/cluster" \
  --summary_json="$TEST_TMPDIR/summary.json" -- --kv_cache_bytes=67108864
# The load really overlapped the restarts (each worker's drain and restart window saw requests).
python3 - "$TEST_TMPDIR/summary.json" <<'PY'
import json, sys
rows = {r["phase"].strip(): r for r in json.load(open(sys.argv[1]))["rows"]}
during = rows["during"]["requests"]
assert during >= 20, f"only {during} requests were sent during the restarts"
print(f"{during} requests during the restarts, {rows['all']['requests']} in all, 0 failed")
PY
