#!/usr/bin/env bash
# Serving benchmark on this machine: router + 1 prefill + 1 decode worker (CPU backend, a
# random-weight Llama, KV over UCX on loopback) driven by tandem_bench.
#
#   tests/bench/serve_1p1d.sh [--model=DIR | --dummy_config=llama-100m] [--num_threads=1] [--tls]
#                             [TANDEM_BENCH_FLAGS...]
#
# Build first: bazel build -c opt //runtime:tandem_worker //router:tandem_router \
#   //router:tandem_cli //tests/bench:tandem_bench   (BIN_DIR=bazel-bin by default)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${BIN_DIR:-$ROOT/bazel-bin}
model_flags=(--load_format=dummy --dummy_config=llama-100m)
threads=1
bench=()
security=(--insecure)
for a in "$@"; do
  case "$a" in
    --tls) security=() ;;  # up.sh's default: mTLS inside, TLS + API key for the bench
    --model=*) model_flags=("$a") ;;
    --dummy_config=*) model_flags=(--load_format=dummy "$a") ;;
    --num_threads=*) threads="${a#*=}" ;;
    *) bench+=("$a") ;;
  esac
done
RUN_DIR=$(mktemp -d /tmp/tandem-bench.XXXXXX)
trap '"$ROOT/deploy/local/down.sh" "$RUN_DIR" >/dev/null; rm -rf "$RUN_DIR"' EXIT
UP=$("$ROOT/deploy/local/up.sh" --prefill=1 --decode=1 "${model_flags[@]}" --run_dir="$RUN_DIR" \
  --bin_dir="$BIN" ${security[@]+"${security[@]}"} -- --num_threads="$threads" \
  --kv_cache_bytes=536870912)
echo "$UP"
ROUTER=$(sed -n 's/^router: //p' <<<"$UP")
if [[ ${#security[@]} -eq 0 ]]; then
  bench+=(--tls_ca="$RUN_DIR/certs/ca.pem")
  export TANDEM_API_KEY
  TANDEM_API_KEY=$(cat "$RUN_DIR/certs/api_key")
fi
"$BIN/tests/bench/tandem_bench" --router="$ROUTER" ${bench[@]+"${bench[@]}"}
