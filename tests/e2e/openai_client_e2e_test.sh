#!/usr/bin/env bash
# The official `openai` Python client against a real local cluster: deploy/local/up.sh with one
# prefill and one decode worker (dummy weights, the Qwen2.5 tokenizer: make_text_model.sh) and
# the router's HTTP API; runs openai_client_test.py (completions, chat, streams, usage, stop, n,
# errors, cancel frees KV on both workers), then tears the cluster down on every exit path.
# Python with `openai`: $TANDEM_PYTHON (tests/run.sh installs it), else python3.
set -uo pipefail
ROOT=$(pwd)  # the runfiles root
PY=${TANDEM_PYTHON:-python3}
if ! "$PY" -c "import openai" 2> /dev/null; then
  echo "openai_client_e2e_test: $PY has no 'openai' package (pip install openai; tests/run.sh" \
       "sets TANDEM_PYTHON to a venv with it)"
  exit 1
fi
RUN="$TEST_TMPDIR/cluster"
MODEL="$TEST_TMPDIR/textmodel"
trap '"$ROOT/deploy/local/down.sh" "$RUN" > /dev/null 2>&1' EXIT
"$ROOT/deploy/local/make_text_model.sh" "$MODEL" || exit 1
"$ROOT/deploy/local/up.sh" --prefill=1 --decode=1 --load_format=dummy --dummy_config="$MODEL" \
  --http_port=0 --http_model="$MODEL" --run_dir="$RUN" --bin_dir="$ROOT" --timeout_s=120 \
  -- --num_threads=1 --metrics_listen=127.0.0.1:0 --kv_cache_bytes=33554432 || {
  tail -n 20 "$RUN"/*.log
  exit 1
}
metrics=()
for log in "$RUN"/prefill-0.log "$RUN"/decode-0.log; do
  url=$(grep -o "metrics on http://[0-9.:]*/metrics" "$log" | head -1 | sed 's/metrics on //')
  [[ -n "$url" ]] || { echo "no metrics URL in $log"; exit 1; }
  metrics+=("$url")
done
"$PY" "$ROOT/tests/e2e/openai_client_test.py" "http://$(cat "$RUN/http.port")" "${metrics[@]}"
