#!/usr/bin/env bash
# tandem_bench against a real tandem_router with fake prefill/decode workers (separate
# processes): Poisson and all-at-once runs complete, every request succeeds, the table and the
# JSON line carry the metrics.
#
# Then over TLS with a client (non-admin) API key: the bench reads the model's limits from
# Router.Health, which any key may call (issue 30 item 10).
#
#   bench_smoke_test.sh TANDEM_ROUTER FAKE_WORKER TANDEM_BENCH MAKE_CERTS
set -uo pipefail
ROUTER=$1 WORKER=$2 BENCH=$3 MAKE_CERTS=$4
TMP=${TEST_TMPDIR:-$(mktemp -d)}
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; for f in "$TMP"/*.log "$TMP"/*.txt; do [[ -f $f ]] && { echo "== $f" >&2; tail -30 "$f" >&2; }; done; exit 1; }

"$ROUTER" --insecure --listen=127.0.0.1:0 --port_file="$TMP/port" --heartbeat_interval_ms=100 --worker_timeout_ms=20000 \
  >"$TMP/router.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do [[ -s $TMP/port ]] && break; sleep 0.1; done
[[ -s $TMP/port ]] || fail "router wrote no port file"
ADDR=$(cat "$TMP/port")
for i in 0 1; do
  "$WORKER" --insecure --router="$ADDR" --role=prefill --worker_id=p$i --vocab_size=5000 >"$TMP/p$i.log" 2>&1 &
  pids+=($!)
  "$WORKER" --insecure --router="$ADDR" --role=decode --worker_id=d$i --vocab_size=5000 --token_delay_ms=1 \
    >"$TMP/d$i.log" 2>&1 &
  pids+=($!)
done
# Wait until all four are registered (the bench reads the vocabulary from ListWorkers).
for _ in $(seq 300); do
  [[ $(grep -c "registered" "$TMP/router.log") -ge 4 ]] && break
  sleep 0.1
done
[[ $(grep -c "registered" "$TMP/router.log") -ge 4 ]] || fail "workers did not register"

"$BENCH" --router="$ADDR" --num_requests=60 --rate=100 --max_concurrency=16 \
  --prompt_len=8:96 --output_len=2:24 --slo_ttft_ms=5000 --slo_tpot_ms=1000 >"$TMP/table.txt" \
  || fail "poisson run failed"
for want in "Successful requests: *60" "Failed requests: *0" "Request throughput" \
  "Output token throughput" "Goodput" "P99 TTFT" "P90 TPOT" "P50 ITL" "E2EL"; do
  grep -qE "$want" "$TMP/table.txt" || fail "table lacks '$want'"
done
cat "$TMP/table.txt"

"$BENCH" --router="$ADDR" --num_requests=40 --rate=inf --prompt_len=32 --output_len=8 --json \
  >"$TMP/json.txt" || fail "burst run failed"
grep -q '"successful_requests":40,"failed_requests":0' "$TMP/json.txt" || fail "json: $(cat "$TMP/json.txt")"
grep -q '"total_output_tokens":320' "$TMP/json.txt" || fail "expected 40 x 8 output tokens"
grep -q '"ttft_ms":{"mean"' "$TMP/json.txt" || fail "json lacks ttft"

# Warmup, then two load levels: one JSON line per level, each naming its rate.
"$BENCH" --router="$ADDR" --num_requests=12 --rate=50,inf --warmup=3 --prompt_len=16 \
  --output_len=4 --json >"$TMP/levels.txt" || fail "levels run failed"
[[ $(wc -l <"$TMP/levels.txt") -eq 2 ]] || fail "want 2 JSON lines: $(cat "$TMP/levels.txt")"
grep -q '^{"rate":"50",.*"successful_requests":12,"failed_requests":0' "$TMP/levels.txt" \
  || fail "level 50: $(cat "$TMP/levels.txt")"
grep -q '^{"rate":"inf",.*"total_output_tokens":48,.*"ttft_ms":{"mean"' "$TMP/levels.txt" \
  || fail "level inf (warmup must not be counted): $(cat "$TMP/levels.txt")"
"$BENCH" --router="$ADDR" --rate=1,x 2>"$TMP/err.txt" && fail "--rate=1,x accepted"
"$BENCH" --router="$ADDR" --warmup=-1 2>"$TMP/err.txt" && fail "--warmup=-1 accepted"

# Bad flags are refused before anything is sent.
"$BENCH" --router="$ADDR" --prompt_len=0 2>"$TMP/err.txt" && fail "--prompt_len=0 accepted"
grep -q "INVALID_ARGUMENT" "$TMP/err.txt" || fail "no INVALID_ARGUMENT: $(cat "$TMP/err.txt")"
"$BENCH" --router="$ADDR" --prompt_len=4000 --output_len=200 2>"$TMP/err.txt" && fail "too long accepted"
grep -q "max_model_len" "$TMP/err.txt" || fail "no max_model_len message"

# TLS, workers with their own certificates, and a key that is not an admin key.
C=$TMP/certs
"$MAKE_CERTS" "$C" --worker=tp:prefill --worker=td:decode >/dev/null || fail "make_certs.sh failed"
echo "sk-bench-client-0123456789abcdef bench" >"$TMP/keys"
"$ROUTER" --listen=127.0.0.1:0 --port_file="$TMP/tls_port" --internal_listen=127.0.0.1:0 \
  --internal_port_file="$TMP/tls_internal" --heartbeat_interval_ms=100 --worker_timeout_ms=20000 \
  --tls_cert="$C/router.pem" --tls_key="$C/router.key" --tls_ca="$C/ca.pem" --api_key_file="$TMP/keys" \
  >"$TMP/tls_router.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do [[ -s $TMP/tls_port && -s $TMP/tls_internal ]] && break; sleep 0.1; done
[[ -s $TMP/tls_internal ]] || fail "TLS router wrote no port files"
for w in tp:prefill td:decode; do
  "$WORKER" --router="$(cat "$TMP/tls_internal")" --tls_cert="$C/${w%:*}.pem" --tls_key="$C/${w%:*}.key" \
    --tls_ca="$C/ca.pem" --role="${w#*:}" --worker_id="${w%:*}" --vocab_size=5000 >"$TMP/${w%:*}.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 300); do
  [[ $(grep -c "registered" "$TMP/tls_router.log") -ge 2 ]] && break
  sleep 0.1
done
TANDEM_API_KEY=sk-bench-client-0123456789abcdef "$BENCH" --router="$(cat "$TMP/tls_port")" \
  --tls_ca="$C/ca.pem" --num_requests=8 --rate=inf --prompt_len=16 --output_len=4 --json \
  >"$TMP/tls.txt" 2>&1 || fail "bench with a client key failed: $(cat "$TMP/tls.txt")"
grep -q '"successful_requests":8,"failed_requests":0' "$TMP/tls.txt" || fail "tls: $(cat "$TMP/tls.txt")"
echo PASS
