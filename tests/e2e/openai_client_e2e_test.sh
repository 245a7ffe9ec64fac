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
"$PY" "$ROOT/tests/e2e/openai_client_test.py" "http://$(cat "$RUN/http.port")" "${metrics[@]}" ||
  exit 1
# tandem_cli's text commands through the same API.
HTTP=$(cat "$RUN/http.port")
out=$("$ROOT/router/tandem_cli" chat --http="$HTTP" --prompt="Hi there" --max_tokens=8 --ignore_eos;
     echo x) || { echo "FAIL tandem_cli chat"; exit 1; }
out=${out%$'\n'x}  # keep trailing newlines: the text may be only whitespace (random weights)
want=$("$PY" - "$HTTP" <<'PYEOF'
import json, sys, urllib.request
req = urllib.request.Request(
    f"http://{sys.argv[1]}/v1/chat/completions", method="POST",
    headers={"Content-Type": "application/json"},
    data=json.dumps({"model": "textmodel", "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                     "messages": [{"role": "user", "content": "Hi there"}]}).encode())
sys.stdout.write(json.load(urllib.request.urlopen(req))["choices"][0]["message"]["content"] + "\n")
PYEOF
echo x)
want=${want%x}
want=${want%$'\n'}
[[ "$out" == "$want" ]] || { echo "FAIL tandem_cli chat printed [$out], the API says [$want]"; exit 1; }
err=$("$ROOT/router/tandem_cli" generate --http="$HTTP" --prompt=x --model=nope 2>&1) &&
  { echo "FAIL tandem_cli generate with an unknown model succeeded"; exit 1; }
[[ $err == *"HTTP 404"*"nope"* ]] || { echo "FAIL tandem_cli error: $err"; exit 1; }
echo "tandem_cli chat / generate --prompt: 2 passed"
