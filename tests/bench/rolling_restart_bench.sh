#!/usr/bin/env bash
# A rolling restart under steady load: brings up router + P prefill + D decode workers
# (deploy/local/up.sh, CPU backend), runs tandem_bench at a steady Poisson rate through the
# router, and after --before_s restarts every worker one at a time
# (deploy/local/rolling_restart.sh); --after_s later the load stops. Prints the requests and
# failures, and TTFT / ITL P50 and P99, before, during and after the restarts and per restarted
# worker (requests by send time). Exit status 1 when any request failed.
#
#   tests/bench/rolling_restart_bench.sh [--prefill=2] [--decode=2] [--rate=4]
#       [--prompt_len=64:256] [--output_len=32:64] [--max_concurrency=64] [--before_s=20]
#       [--after_s=10] [--settle_s=0] [--dummy_config=tiny | --model=DIR] [--num_threads=1]
#       [--bin_dir=bazel-bin] [--run_dir=DIR (kept)] [--summary_json=FILE] [--insecure]
#       [-- WORKER_FLAGS]
#
# Build first: bazel build -c opt //runtime:tandem_worker //router:tandem_router \
#   //router:tandem_cli //tests/bench:tandem_bench
# The cluster is up.sh's default (TLS, mTLS between router and workers, an API key; tandem_bench
# uses up.sh's CA and key); --insecure runs it all in plain text.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
prefill=2 decode=2 rate=4 prompt_len=64:256 output_len=32:64 max_concurrency=64
before_s=20 after_s=10 settle_s=0 threads=1 insecure=0
bin_dir="$ROOT/bazel-bin" run_dir="" summary_json=""
model_flags=(--load_format=dummy --dummy_config=tiny)
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --prefill=*) prefill="${1#*=}" ;;
    --decode=*) decode="${1#*=}" ;;
    --rate=*) rate="${1#*=}" ;;
    --prompt_len=*) prompt_len="${1#*=}" ;;
    --output_len=*) output_len="${1#*=}" ;;
    --max_concurrency=*) max_concurrency="${1#*=}" ;;
    --before_s=*) before_s="${1#*=}" ;;
    --after_s=*) after_s="${1#*=}" ;;
    --settle_s=*) settle_s="${1#*=}" ;;  # rolling_restart.sh's pause between workers
    --dummy_config=*) model_flags=(--load_format=dummy "$1") ;;
    --model=*) model_flags=("$1") ;;
    --num_threads=*) threads="${1#*=}" ;;
    --bin_dir=*) bin_dir="${1#*=}" ;;
    --run_dir=*) run_dir="${1#*=}" ;;
    --summary_json=*) summary_json="${1#*=}" ;;
    --insecure) insecure=1 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "rolling_restart_bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
keep=1
if [[ -z "$run_dir" ]]; then
  run_dir=$(mktemp -d "${TMPDIR:-/tmp}/tandem-rolling.XXXXXX")
  keep=0
fi
mkdir -p "$run_dir"
bench_pid=""
cleanup() {
  [[ -n "$bench_pid" ]] && kill "$bench_pid" 2>/dev/null
  "$ROOT/deploy/local/down.sh" "$run_dir" --grace_s=20 > /dev/null || true
  [[ "$keep" == 1 ]] || rm -rf "$run_dir"
}
trap cleanup EXIT

sec=()
[[ "$insecure" == 1 ]] && sec=(--insecure)
up=$("$ROOT/deploy/local/up.sh" --prefill="$prefill" --decode="$decode" "${model_flags[@]}" \
  --run_dir="$run_dir" --bin_dir="$bin_dir" ${sec[@]+"${sec[@]}"} -- --num_threads="$threads" \
  ${extra[@]+"${extra[@]}"})
echo "$up"
router=$(sed -n 's/^router: //p' <<< "$up")
bench_sec=()
if [[ "$insecure" == 0 ]]; then
  bench_sec=(--tls_ca="$(sed -n 's/^tls_ca: //p' <<< "$up")")
  TANDEM_API_KEY="$(cat "$(sed -n 's/^api_key_file: //p' <<< "$up")")"
  export TANDEM_API_KEY
  # up.sh hands users a client key: it lists no worker (addresses, epochs); the operator's key
  # does (issue 30 item 10).
  if "$bin_dir/router/tandem_cli" workers --router="$router" "${bench_sec[@]}" > /dev/null 2>&1; then
    echo "rolling_restart_bench.sh: up.sh's api_key_file lists workers (an admin key)" >&2
    exit 1
  fi
  "$bin_dir/router/tandem_cli" workers --router="$router" "${bench_sec[@]}" \
    --api_key="$(cat "$(sed -n 's/^admin_api_key_file: //p' <<< "$up")")" > /dev/null
fi

rm -f "$run_dir/stop" "$run_dir/requests.jsonl"
"$bin_dir/tests/bench/tandem_bench" --router="$router" ${bench_sec[@]+"${bench_sec[@]}"} \
  --rate="$rate" --num_requests=1000000 \
  --prompt_len="$prompt_len" --output_len="$output_len" --max_concurrency="$max_concurrency" \
  --warmup=2 --stop_file="$run_dir/stop" --requests_out="$run_dir/requests.jsonl" --json \
  > "$run_dir/bench.json" 2> "$run_dir/bench.err" &
bench_pid=$!
sleep "$before_s"
restart_rc=0
"$ROOT/deploy/local/rolling_restart.sh" "$run_dir" --settle_s="$settle_s" | tee "$run_dir/phases.txt" || restart_rc=$?
sleep "$after_s"
touch "$run_dir/stop"
bench_rc=0
wait "$bench_pid" || bench_rc=$?
bench_pid=""
cat "$run_dir/bench.err" >&2

python3 - "$run_dir/requests.jsonl" "$run_dir/phases.txt" "$rate" "${summary_json:-/dev/null}" <<'EOF'
import json, math, sys

requests = [json.loads(l) for l in open(sys.argv[1])]
phases = []
for line in open(sys.argv[2]):
    if line.startswith("phase "):
        phases.append(dict(kv.split("=", 1) for kv in line.split()[1:]))

def rank(values, p):  # nearest rank, as tests/bench/stats.cc
    if not values:
        return float("nan")
    v = sorted(values)
    return v[max(1, math.ceil(p / 100 * len(v))) - 1]

def row(name, reqs):
    ok = [r for r in reqs if r["ok"]]
    ttft = [r["ttft_ms"] for r in ok]
    itl = [g for r in ok for g in r["itl_ms"]]
    return {"phase": name, "requests": len(reqs), "failed": len(reqs) - len(ok),
            "ttft_p50_ms": rank(ttft, 50), "ttft_p99_ms": rank(ttft, 99),
            "itl_p50_ms": rank(itl, 50), "itl_p99_ms": rank(itl, 99)}

rows = []
if phases:
    begin = float(phases[0]["begin_unix_ms"])
    end = float(phases[-1]["healthy_unix_ms"])
    rows.append(row("before", [r for r in requests if r["sent_unix_ms"] < begin]))
    rows.append(row("during", [r for r in requests if begin <= r["sent_unix_ms"] <= end]))
    rows.append(row("after", [r for r in requests if r["sent_unix_ms"] > end]))
    for p in phases:
        b, e = float(p["begin_unix_ms"]), float(p["healthy_unix_ms"])
        rows.append(row("  restart " + p["worker"],
                        [r for r in requests if b <= r["sent_unix_ms"] <= e]))
rows.append(row("all", requests))
print(f"rolling restart under load at {sys.argv[3]} req/s:")
print(f"{'phase':<22} {'requests':>8} {'failed':>6} {'TTFT p50':>9} {'TTFT p99':>9} "
      f"{'ITL p50':>8} {'ITL p99':>8}   (ms)")
for r in rows:
    print(f"{r['phase']:<22} {r['requests']:>8} {r['failed']:>6} {r['ttft_p50_ms']:>9.1f} "
          f"{r['ttft_p99_ms']:>9.1f} {r['itl_p50_ms']:>8.1f} {r['itl_p99_ms']:>8.1f}")
for p in phases:
    print(f"{p['worker']}: drain {p['drain_ms']} ms, restart to healthy {p['restart_ms']} ms"
          f" ({p['drain']})")
errors = {}
for r in requests:
    if not r["ok"]:
        errors[r["error"]] = errors.get(r["error"], 0) + 1
for e, n in errors.items():
    print(f"failed x{n}: {e}")
with open(sys.argv[4], "w") as f:
    json.dump({"rate": sys.argv[3], "rows": rows, "phases": phases}, f)
EOF
# A KV read that failed was recomputed by the decode worker (router default
# --on_kv_failure=recompute): the client saw no error, but a drain that dropped leases shows here.
kv_failures=$(cat "$run_dir"/decode-*.log | grep -c "KV load of request .* failed\|cannot reach KV source" || true)
echo "KV loads failed (recomputed on D): $kv_failures"
failed=$(python3 -c 'import json,sys; print(sum(1 for l in open(sys.argv[1]) if not json.loads(l)["ok"]))' \
  "$run_dir/requests.jsonl")
if [[ "$restart_rc" != 0 || "$bench_rc" != 0 || "$failed" != 0 || "$kv_failures" != 0 ]]; then
  echo "FAIL: rolling restart rc $restart_rc, tandem_bench rc $bench_rc, $failed failed requests," \
    "$kv_failures KV loads failed" >&2
  exit 1
fi
echo "PASS: 0 failed requests across the rolling restart"
