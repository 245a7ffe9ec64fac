#!/usr/bin/env bash
# Issue 30 items 1-2 with a real tandem_router over HTTPS (its certificates and API key from
# deploy/certs/make_certs.sh, the Qwen2.5 tokenizer from make_text_model.sh): deeply nested JSON
# gets a 400 naming the limit and the router lives on; keyless and keyed 8 MiB uploads keep the
# router's RSS within stated bounds (http_abuse_test.py); then a SIGSEGV sent to the router
# leaves the signal and a stack trace in its log (the crash handler every daemon installs).
# Set UPLOADS to change the 1,000 uploads per phase.
set -uo pipefail
ROOT=$(pwd)  # the runfiles root
PY=${TANDEM_PYTHON:-python3}
DIR="$TEST_TMPDIR/abuse"
mkdir -p "$DIR"
pid=""
trap '[[ -n "$pid" ]] && kill "$pid" 2> /dev/null; wait 2> /dev/null' EXIT
"$ROOT/deploy/certs/make_certs.sh" "$DIR/certs" --api_key > /dev/null || exit 1
"$ROOT/deploy/local/make_text_model.sh" "$DIR/model" || exit 1
"$ROOT/router/tandem_router" --listen=127.0.0.1:0 --port_file="$DIR/router.port" \
  --tls_cert="$DIR/certs/router.pem" --tls_key="$DIR/certs/router.key" \
  --tls_ca="$DIR/certs/ca.pem" --api_key_file="$DIR/certs/api_keys" \
  --internal_listen=127.0.0.1:0 --http_listen=127.0.0.1:0 --model="$DIR/model" \
  --served_model_name=textmodel --http_port_file="$DIR/http.port" > "$DIR/router.log" 2>&1 &
pid=$!
for _ in $(seq 300); do [[ -s "$DIR/http.port" ]] && break; sleep 0.1; done
[[ -s "$DIR/http.port" ]] || { echo "FAIL router did not start"; cat "$DIR/router.log"; exit 1; }
"$PY" "$ROOT/tests/e2e/http_abuse_test.py" "$(cat "$DIR/http.port")" "$pid" \
  "$DIR/certs/ca.pem" "$(cat "$DIR/certs/api_key")" "${UPLOADS:-1000}" ||
  { echo "FAIL"; tail -n 20 "$DIR/router.log"; exit 1; }
kill -0 "$pid" || { echo "FAIL the router died"; cat "$DIR/router.log"; exit 1; }
# The crash handler: a fatal signal leaves its name and a symbolized trace in the log.
kill -SEGV "$pid"
wait "$pid" 2> /dev/null
pid=""
grep -q "SIGSEGV received" "$DIR/router.log" && grep -q "PC: @ " "$DIR/router.log" ||
  { echo "FAIL no crash report in the router's log"; tail -n 30 "$DIR/router.log"; exit 1; }
echo "crash handler: 1 passed (SIGSEGV -> signal and stack trace in the log)"
