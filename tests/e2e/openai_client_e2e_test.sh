#!/usr/bin/env bash
# The official `openai` Python client against a real local cluster: deploy/local/up.sh with one
# prefill group (--prefill_tp=2) and one decode worker (dummy weights, the Qwen2.5 tokenizer:
# make_text_model.sh) and the router's HTTP API over HTTPS (up.sh's default: the router's certificate and API key); runs
# openai_client_test.py (completions, chat, streams, usage, stop, n, errors, cancel frees KV on
# both workers) with the CA passed to the client, checks that a wrong key, plain http:// and a
# client without the CA are refused, then tears the cluster down on every exit path.
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
# The prefill worker is a tensor-parallel group of 2 ranks and the decode worker a single one: the
# KV is re-sharded by heads between them (the issue's `up.sh --prefill_tp=2 --decode_tp=1` demo).
"$ROOT/deploy/local/up.sh" --prefill=1 --decode=1 --prefill_tp=2 --decode_tp=1 \
  --load_format=dummy --dummy_config="$MODEL" \
  --http_port=0 --http_model="$MODEL" --run_dir="$RUN" --bin_dir="$ROOT" --timeout_s=120 \
  -- --num_threads=1 --metrics_listen=127.0.0.1:0 --kv_cache_bytes=33554432 \
  > "$TEST_TMPDIR/up.out" || {
  cat "$TEST_TMPDIR/up.out"
  tail -n 20 "$RUN"/*.log
  exit 1
}
# up.sh's default: the router's ports serve TLS with its certificates and require the API key it
# generated.
TANDEM_API_KEY=$(cat "$RUN/certs/api_key") || { echo "FAIL no API key from up.sh"; exit 1; }
TANDEM_TLS_CA="$RUN/certs/ca.pem"
export TANDEM_API_KEY TANDEM_TLS_CA
HTTP=$(cat "$RUN/http.port")
grep -qx "http: https://$HTTP" "$TEST_TMPDIR/up.out" ||
  { echo "FAIL up.sh did not print http: https://$HTTP"; cat "$TEST_TMPDIR/up.out"; exit 1; }
"$PY" - "$HTTP" <<'PYEOF' || { echo "FAIL API key / TLS checks"; exit 1; }
import os, ssl, sys, openai
host = sys.argv[1]
ca = ssl.create_default_context(cafile=os.environ["TANDEM_TLS_CA"])
def client(scheme="https", key=os.environ["TANDEM_API_KEY"], verify=ca):
    return openai.OpenAI(base_url=f"{scheme}://{host}/v1", api_key=key, max_retries=0, timeout=30,
                         http_client=openai.DefaultHttpxClient(verify=verify))
for key in ("wrong-key-0123456789", "x"):
    try:
        client(key=key).models.list()
        sys.exit(f"a request with key {key!r} was served")
    except openai.AuthenticationError as e:
        assert e.status_code == 401 and e.body["type"] == "authentication_error", e
try:  # plain HTTP to the HTTPS port: the server says so in plain text
    client(scheme="http").models.list()
    sys.exit("plain http:// was served")
except openai.BadRequestError as e:
    assert "https://" in str(e), e
try:  # the system's trust store does not know the cluster CA
    client(verify=True).models.list()
    sys.exit("a client without the cluster CA connected")
except openai.APIConnectionError as e:
    pass
print("API key / TLS checks: 4 passed (wrong key -> 401, http:// -> 400, unknown CA refused)")
PYEOF
metrics=()
for log in "$RUN"/prefill-0.log "$RUN"/decode-0.log; do
  url=$(grep -o "metrics on http://[0-9.:]*/metrics" "$log" | head -1 | sed 's/metrics on //')
  [[ -n "$url" ]] || { echo "no metrics URL in $log"; exit 1; }
  metrics+=("$url")
done
# The workers' /metrics stay plain HTTP on their own internal port.
"$PY" "$ROOT/tests/e2e/openai_client_test.py" "https://$HTTP" "${metrics[@]}" || exit 1
# tandem_cli's text commands through the same API (HTTPS: --tls_ca).
out=$("$ROOT/router/tandem_cli" chat --http="https://$HTTP" --tls_ca="$TANDEM_TLS_CA" \
     --prompt="Hi there" --max_tokens=8 --ignore_eos; echo x) ||
  { echo "FAIL tandem_cli chat"; exit 1; }
out=${out%$'\n'x}  # keep trailing newlines: the text may be only whitespace (random weights)
want=$("$PY" - "$HTTP" <<'PYEOF'
import json, os, ssl, sys, urllib.request
req = urllib.request.Request(
    f"https://{sys.argv[1]}/v1/chat/completions", method="POST",
    headers={"Content-Type": "application/json",
             "Authorization": "Bearer " + os.environ["TANDEM_API_KEY"]},
    data=json.dumps({"model": "textmodel", "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                     "messages": [{"role": "user", "content": "Hi there"}]}).encode())
ca = ssl.create_default_context(cafile=os.environ["TANDEM_TLS_CA"])
reply = json.load(urllib.request.urlopen(req, context=ca))
sys.stdout.write(reply["choices"][0]["message"]["content"] + "\n")
PYEOF
echo x)
want=${want%x}
want=${want%$'\n'}
[[ "$out" == "$want" ]] || { echo "FAIL tandem_cli chat printed [$out], the API says [$want]"; exit 1; }
err=$("$ROOT/router/tandem_cli" generate --http="$HTTP" --tls_ca="$TANDEM_TLS_CA" --prompt=x \
     --model=nope 2>&1) &&
  { echo "FAIL tandem_cli generate with an unknown model succeeded"; exit 1; }
[[ $err == *"HTTP 404"*"nope"* ]] || { echo "FAIL tandem_cli error: $err"; exit 1; }
err=$("$ROOT/router/tandem_cli" generate --http="$HTTP" --insecure --prompt=x 2>&1) &&
  { echo "FAIL tandem_cli spoke plain HTTP to the HTTPS port"; exit 1; }
[[ $err == *"HTTP 400"*"https://"* ]] || { echo "FAIL tandem_cli plain HTTP error: $err"; exit 1; }
echo "tandem_cli chat / generate --prompt over HTTPS: 3 passed"
