#!/usr/bin/env bash
# Router, prefill worker, decode worker and CLI as separate processes on loopback:
# registration, streaming output checked against the fake model, validation errors, a decode
# worker killed (SIGKILL) mid-stream, and graceful router shutdown on SIGTERM.
#
#   multiprocess_test.sh TANDEM_ROUTER FAKE_WORKER TANDEM_CLI MAKE_CERTS [tls|insecure]
#
# tls (default): certificates from deploy/certs/make_certs.sh, the public port with TLS and its
# client API key (TANDEM_API_KEY for the CLI: generate, health), workers registering on the
# internal mTLS port with their own certificates, `workers` with the operator key and stats with
# the admin certificate; plus the refusals: no key / a wrong key -> UNAUTHENTICATED, the client
# key listing workers -> PERMISSION_DENIED (issue 30 item 10).
# insecure: everything in plain text with --insecure on one port (the legacy mode).
set -uo pipefail
ROUTER=$1 WORKER=$2 CLI=$3 MAKE_CERTS=$4 MODE=${5:-tls}
TMP=${TEST_TMPDIR:-$(mktemp -d)}
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; for f in "$TMP"/*.log; do echo "== $f" >&2; tail -20 "$f" >&2; done; exit 1; }

if [[ $MODE == tls ]]; then
  # Each worker registers with its own certificate (naming it): role-only ones may not.
  "$MAKE_CERTS" "$TMP/certs" --api_key --worker=p0:prefill --worker=d0:decode >/dev/null ||
    fail "make_certs.sh failed"
  C=$TMP/certs
  router_sec=(--tls_cert="$C/router.pem" --tls_key="$C/router.key" --tls_ca="$C/ca.pem"
              --api_key_file="$C/api_keys" --internal_listen=127.0.0.1:0
              --internal_port_file="$TMP/internal_port")
  worker_sec() { echo --tls_cert="$C/$1.pem" --tls_key="$C/$1.key" --tls_ca="$C/ca.pem"; }
  cli_sec=(--tls_ca="$C/ca.pem")
  admin_sec=(--tls_ca="$C/ca.pem" --tls_cert="$C/admin.pem" --tls_key="$C/admin.key")
  export TANDEM_API_KEY=$(cat "$C/api_key")
  operator=(--api_key="$(cat "$C/admin_api_key")")
else
  operator=()
  router_sec=(--insecure)
  worker_sec() { echo --insecure; }
  cli_sec=(--insecure)
  admin_sec=(--insecure)
fi
"$ROUTER" --listen=127.0.0.1:0 --port_file="$TMP/port" --heartbeat_interval_ms=100 \
  --worker_timeout_ms=20000 "${router_sec[@]}" >"$TMP/router.log" 2>&1 &
router_pid=$!
pids+=("$router_pid")
for _ in $(seq 300); do [[ -s $TMP/port ]] && break; sleep 0.1; done
[[ -s $TMP/port ]] || fail "router wrote no port file"
ADDR=$(cat "$TMP/port")
grep -q "router listening on $ADDR" "$TMP/router.log" || sleep 1
grep -q "router listening on $ADDR" "$TMP/router.log" || fail "no 'router listening on $ADDR' line"
INTERNAL=$ADDR
if [[ $MODE == tls ]]; then
  INTERNAL=$(cat "$TMP/internal_port")
  [[ $INTERNAL != "$ADDR" ]] || fail "internal port is the public one"
  # No key, a wrong key: UNAUTHENTICATED, saying nothing about why.
  TANDEM_API_KEY= "$CLI" health --router="$ADDR" "${cli_sec[@]}" 2>"$TMP/err.txt" && fail "health without a key"
  grep -q "UNAUTHENTICATED: authentication failed" "$TMP/err.txt" || fail "no key: $(cat "$TMP/err.txt")"
  "$CLI" health --router="$ADDR" "${cli_sec[@]}" --api_key=tk-not-the-key-0000000000 2>"$TMP/err.txt" &&
    fail "health with a wrong key"
  grep -q "UNAUTHENTICATED: authentication failed" "$TMP/err.txt" || fail "wrong key: $(cat "$TMP/err.txt")"
  # Plain text to the TLS port fails.
  "$CLI" health --router="$ADDR" --insecure 2>/dev/null && fail "plain text accepted on the TLS port"
  grep -q "WARNING.*INSECURE" "$TMP/router.log" && fail "TLS router logged the insecure warning"
else
  grep -q "INSECURE" "$TMP/router.log" || fail "the insecure router did not log a warning"
fi

# Nothing registered yet: health says not serving (exit 2), generate is UNAVAILABLE.
"$CLI" health --router="$ADDR" "${cli_sec[@]}" >/dev/null; [[ $? -eq 2 ]] || fail "health should exit 2 without workers"
"$CLI" generate --router="$ADDR" "${cli_sec[@]}" --prompt_ids=1 --max_tokens=2 2>"$TMP/err.txt" && fail "generate without workers succeeded"
grep -q UNAVAILABLE "$TMP/err.txt" || fail "expected UNAVAILABLE, got: $(cat "$TMP/err.txt")"

"$WORKER" --router="$INTERNAL" $(worker_sec p0) --role=prefill --worker_id=p0 >"$TMP/p0.log" 2>&1 &
pids+=($!)
"$WORKER" --router="$INTERNAL" $(worker_sec d0) --role=decode --worker_id=d0 --token_delay_ms=5 >"$TMP/d0.log" 2>&1 &
d0_pid=$!
pids+=("$d0_pid")
ready=0
for _ in $(seq 300); do
  if "$CLI" health --router="$ADDR" "${cli_sec[@]}" >/dev/null 2>&1; then ready=1; break; fi
  sleep 0.1
done
[[ $ready -eq 1 ]] || fail "router never became SERVING"
"$CLI" workers --router="$ADDR" "${cli_sec[@]}" ${operator[@]+"${operator[@]}"} >"$TMP/workers.txt" ||
  fail "workers failed"
if [[ $MODE == tls ]]; then
  # The client key (what users get) serves generate and health but lists no worker.
  "$CLI" workers --router="$ADDR" "${cli_sec[@]}" 2>"$TMP/err.txt" && fail "the client key listed workers"
  grep -q "PERMISSION_DENIED: permission denied" "$TMP/err.txt" || fail "client workers: $(cat "$TMP/err.txt")"
fi
grep -qE '^d0 +decode .* yes ' "$TMP/workers.txt" || fail "d0 not listed healthy: $(cat "$TMP/workers.txt")"
grep -qE '^p0 +prefill .* yes ' "$TMP/workers.txt" || fail "p0 not listed healthy"

# A worker's own stats, asked of the worker at the address the router lists.
p0_addr=$(awk '$1 == "p0" {print $3}' "$TMP/workers.txt")
out=$("$CLI" stats --worker="$p0_addr" "${admin_sec[@]}" --json) || fail "stats --worker=$p0_addr failed"
[[ $out == *'"worker_id":"p0"'* && $out == *'"kv_load_failures":"0"'* ]] || fail "stats: $out"
"$CLI" stats "${admin_sec[@]}" 2>"$TMP/err.txt" && fail "stats without --worker succeeded"
grep -q "INVALID_ARGUMENT.*--worker is required" "$TMP/err.txt" || fail "stats: $(cat "$TMP/err.txt")"

# The fake model: next = (31 * prev + 7) % 1000 from the last prompt token.
expected=() prev=3
for _ in $(seq 8); do prev=$(( (31 * prev + 7) % 1000 )); expected+=("$prev"); done
want_json="\"tokens\":[$(IFS=,; echo "${expected[*]}")],\"finish_reason\":\"length\""
out=$("$CLI" generate --router="$ADDR" "${cli_sec[@]}" --prompt_ids=1,2,3 --max_tokens=8 --json) || fail "generate --json failed"
[[ $out == *"$want_json"* ]] || fail "json: want $want_json in: $out"
[[ $out == *'"usage":{"prompt_tokens":3,"completion_tokens":8,'* ]] || fail "usage: $out"
out=$("$CLI" generate --router="$ADDR" "${cli_sec[@]}" --prompt_ids=1,2,3 --max_tokens=8 --request_id=plain 2>"$TMP/summary.txt") \
  || fail "generate failed"
[[ $out == "${expected[*]}" ]] || fail "stream: want '${expected[*]}', got '$out'"
grep -q "request_id=plain finish_reason=length" "$TMP/summary.txt" || fail "summary: $(cat "$TMP/summary.txt")"
# Both streams on one pipe (a log, `2>&1 | tee`): stdout is then fully buffered, stderr not, and
# the token line must still end before the summary line (it used to read "...532request_id=").
out=$("$CLI" generate --router="$ADDR" "${cli_sec[@]}" --prompt_ids=1,2,3 --max_tokens=8 --request_id=piped 2>&1) \
  || fail "generate (one pipe) failed"
[[ $(sed -n 1p <<<"$out") == "${expected[*]}" ]] || fail "one pipe: token line: '$out'"
[[ $(sed -n 2p <<<"$out") == "request_id=piped finish_reason=length "* ]] || fail "one pipe: summary line: '$out'"

# Validation: non-zero exit with the gRPC status.
"$CLI" generate --router="$ADDR" "${cli_sec[@]}" --prompt_ids=1,5000 --max_tokens=2 2>"$TMP/err.txt" && fail "bad token accepted"
grep -q "INVALID_ARGUMENT.*5000" "$TMP/err.txt" || fail "expected INVALID_ARGUMENT: $(cat "$TMP/err.txt")"

# Kill the decode worker mid-stream: the client gets UNAVAILABLE, long before its deadline.
"$CLI" generate --router="$ADDR" "${cli_sec[@]}" --prompt_ids=4,5 --max_tokens=3000 --timeout_ms=60000 \
  >"$TMP/long.txt" 2>"$TMP/long_err.txt" &
cli_pid=$!
for _ in $(seq 300); do [[ $(wc -w <"$TMP/long.txt") -ge 5 ]] && break; sleep 0.05; done
[[ $(wc -w <"$TMP/long.txt") -ge 5 ]] || fail "no streamed tokens before the kill"
kill -9 "$d0_pid"
start=$(date +%s)
wait "$cli_pid"; rc=$?
[[ $rc -ne 0 ]] || fail "the long request succeeded although its decode worker died"
grep -q UNAVAILABLE "$TMP/long_err.txt" || fail "expected UNAVAILABLE: $(cat "$TMP/long_err.txt")"
echo "client saw the dead decode worker after $(( $(date +%s) - start ))s"
"$CLI" workers --router="$ADDR" "${cli_sec[@]}" ${operator[@]+"${operator[@]}"} | grep -qE '^d0 .* no ' ||
  fail "d0 should be unhealthy"

if [[ $MODE == tls ]]; then
  # The admin certificate lists workers on the internal port; a worker's certificate may not.
  "$CLI" workers --router="$INTERNAL" "${admin_sec[@]}" --api_key= | grep -q '^p0 ' ||
    fail "admin certificate could not list workers on the internal port"
  "$CLI" workers --router="$INTERNAL" $(worker_sec prefill) 2>"$TMP/err.txt" &&
    fail "a worker certificate listed workers"
  grep -q "PERMISSION_DENIED: permission denied" "$TMP/err.txt" || fail "worker ListWorkers: $(cat "$TMP/err.txt")"
  # Stats with the router's API key but no admin certificate: the worker refuses the handshake.
  "$CLI" stats --worker="$p0_addr" "${cli_sec[@]}" 2>/dev/null && fail "stats without a certificate"
fi

# SIGTERM: graceful shutdown, exit 0.
kill -TERM "$router_pid"
wait "$router_pid"; rc=$?
[[ $rc -eq 0 ]] || fail "router exited $rc on SIGTERM"
grep -q "router stopped" "$TMP/router.log" || fail "no 'router stopped'"
echo PASS
