#!/usr/bin/env bash
# Launches a local Tandem cluster: one router + N prefill + M decode (+ K mixed) workers on
# localhost, waits until the router sees every worker healthy, and prints `router: HOST:PORT`.
#
#   deploy/local/up.sh [--prefill=1] [--decode=1] [--mixed=0] [--backend=cpu]
#                      [--model=DIR | --load_format=dummy [--dummy_config=tiny]]
#                      [--run_dir=out/local] [--bin_dir=bazel-bin] [--router_port=0]
#                      [--timeout_s=120] [--http_port=PORT [--http_model=DIR]]
#                      [--prefill_tp=1] [--decode_tp=1] [--mixed_tp=1]
#                      [--decode_dcp=1] [--mixed_dcp=1] [--prefill_ep] [--decode_ep] [--mixed_ep]
#                      [--prefill_dp_attention] [--decode_dp_attention] [--mixed_dp_attention]
#                      [--insecure] [-- EXTRA_WORKER_FLAGS...]
#                      [--speculative_method=ngram --num_speculative_tokens=K]
#                      [--ngram_min=1] [--ngram_max=4] [--speculative_adaptive=true]
#                      [--speculative_method=draft --num_speculative_tokens=K --draft_model=DIR]
#                      [--speculative_method=mtp --num_speculative_tokens=K]
#
# Secure by default: deploy/certs/make_certs.sh writes a cluster CA, per-role certificates, one
# certificate per worker (ROLE-I, naming the worker) and two API keys to RUN_DIR/certs (kept
# across runs); the router's public port serves TLS and requires a key, workers register on its
# internal mTLS port with their own certificates. Users get the client key:
# tandem_cli --tls_ca=RUN_DIR/certs/ca.pem with TANDEM_API_KEY=$(cat RUN_DIR/certs/api_key)
# (generate, health, abort; tandem_bench). The operator key, RUN_DIR/certs/admin_api_key, also
# lists the workers (addresses, epochs: `tandem_cli workers`); up.sh prints the three paths.
# --insecure: everything in plain text, no keys.
#
# --http_port: also serve the OpenAI-compatible HTTP API on the router (0 = any free port) and
# print its URL, `http: https://HOST:PORT` (the router's certificate, the same API key; clients
# pass the CA, e.g. curl --cacert RUN_DIR/certs/ca.pem; `http://` with --insecure); it reads the
# tokenizer and chat template of --http_model (default --model; with dummy weights, a directory
# with tokenizer.json + config.json).
#
# --prefill_tp / --decode_tp / --mixed_tp: each worker of that role is a tensor-parallel group of
# that many ranks (tandem_worker --tp=N starts its ranks on this host); P and D groups of
# different sizes exchange KV re-sharded by heads (kvtransfer/rank_reader.h).
# --prefill_ep / --decode_ep / --mixed_ep: expert parallelism in that role's groups (tandem_worker
# --enable_expert_parallel: each MoE layer's experts placed whole on the group's --*_tp ranks,
# which must divide the experts; comm/README.md). KV is attention-only: P and D may differ.
# --prefill_dp_attention / --decode_dp_attention / --mixed_dp_attention: wide EP in that role's
# groups (tandem_worker --enable_expert_parallel --dp_attention: each of the --*_tp ranks serves
# its own requests' attention and KV, MoE rows dispatched to the experts' ranks by all-to-all;
# comm/README.md).
# A prefill group's KV handles name the DP rank holding each request (its block ids).
# --decode_dcp=K / --mixed_dcp=K: decode context parallelism in those groups (tandem_worker
# --dcp=K: K KV shards per attention slice; runtime/model/tensor_parallel.h); the group has
# --decode_tp ranks in all, which K must divide; --decode_dcp=K alone means --decode_tp=K. Each D
# rank reads exactly its shard's blocks from the prefill group.
#
# --speculative_method / --num_speculative_tokens / --ngram_min / --ngram_max /
# --speculative_adaptive / --speculative_disable_by_batch_size / --draft_model: speculative
# decoding on the decode and mixed workers (the same tandem_worker flags; prefill workers never
# speculate; runtime/engine/speculative.h; --draft_model=DIR of the target's vocabulary, or
# dummy:CONFIG[:SEED]; mtp: the DeepSeek-V3 --model's own MTP layer; prefill workers get the mtp
# flags too and hand the MTP's state of each prompt to the decode worker: CPU backend only; on
# CUDA the decode worker's MTP sees zeros for the prompt, exact, lower acceptance).
#
# Everything binds to 127.0.0.1. Logs and pids go to RUN_DIR; deploy/local/down.sh RUN_DIR stops
# the cluster. Binaries come from BIN_DIR (build them first: bazel build -c opt
# //runtime:tandem_worker //router:tandem_router //router:tandem_cli).
set -euo pipefail

prefill_tp=1 decode_tp="" mixed_tp="" decode_dcp=1 mixed_dcp=1
prefill_ep=0 decode_ep=0 mixed_ep=0 prefill_dpa=0 decode_dpa=0 mixed_dpa=0
prefill=1 decode=1 mixed=0 backend=cpu model="" load_format="" dummy_config=""
run_dir=out/local bin_dir=bazel-bin router_port=0 timeout_s=120 http_port="" http_model=""
insecure=0
extra=() spec=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --prefill=*) prefill="${1#*=}" ;;
    --decode=*) decode="${1#*=}" ;;
    --mixed=*) mixed="${1#*=}" ;;
    --prefill_tp=*) prefill_tp="${1#*=}" ;;
    --decode_tp=*) decode_tp="${1#*=}" ;;
    --mixed_tp=*) mixed_tp="${1#*=}" ;;
    --decode_dcp=*) decode_dcp="${1#*=}" ;;
    --mixed_dcp=*) mixed_dcp="${1#*=}" ;;
    --prefill_ep) prefill_ep=1 ;;
    --decode_ep) decode_ep=1 ;;
    --mixed_ep) mixed_ep=1 ;;
    --prefill_dp_attention) prefill_dpa=1 ;;
    --decode_dp_attention) decode_dpa=1 ;;
    --mixed_dp_attention) mixed_dpa=1 ;;
    --backend=*) backend="${1#*=}" ;;
    --model=*) model="${1#*=}" ;;
    --load_format=*) load_format="${1#*=}" ;;
    --dummy_config=*) dummy_config="${1#*=}" ;;
    --run_dir=*) run_dir="${1#*=}" ;;
    --bin_dir=*) bin_dir="${1#*=}" ;;
    --router_port=*) router_port="${1#*=}" ;;
    --timeout_s=*) timeout_s="${1#*=}" ;;
    --http_port=*) http_port="${1#*=}" ;;
    --http_model=*) http_model="${1#*=}" ;;
    --insecure) insecure=1 ;;
    --speculative_method=* | --num_speculative_tokens=* | --ngram_min=* | --ngram_max=* | \
      --speculative_adaptive=* | --speculative_disable_by_batch_size=* | --draft_model=*)
      spec+=("$1") ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "up.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
# A DCP group has --*_tp ranks in all; --*_dcp=K alone means K ranks.
decode_tp=${decode_tp:-$decode_dcp}
mixed_tp=${mixed_tp:-$mixed_dcp}

worker_bin="$bin_dir/runtime/tandem_worker"
router_bin="$bin_dir/router/tandem_router"
cli_bin="$bin_dir/router/tandem_cli"
for b in "$worker_bin" "$router_bin" "$cli_bin"; do
  [[ -x "$b" ]] || { echo "up.sh: $b not found; build it first (see the header)" >&2; exit 1; }
done
if [[ -z "$model" && -z "$load_format" ]]; then
  echo "up.sh: pass --model=DIR or --load_format=dummy" >&2
  exit 2
fi
model_flags=()
[[ -n "$model" ]] && model_flags+=("--model=$model")
[[ -n "$load_format" ]] && model_flags+=("--load_format=$load_format")
[[ -n "$dummy_config" ]] && model_flags+=("--dummy_config=$dummy_config")

mkdir -p "$run_dir"
if [[ -s "$run_dir/pids" ]]; then
  echo "up.sh: $run_dir/pids exists; run deploy/local/down.sh $run_dir first" >&2
  exit 1
fi
: > "$run_dir/pids"

wait_file() {  # wait_file PATH PID WHAT
  local deadline=$((SECONDS + timeout_s))
  until [[ -s "$1" ]]; do
    if ! kill -0 "$2" 2>/dev/null; then
      echo "up.sh: $3 exited; its log:" >&2
      tail -n 30 "$run_dir/$3.log" >&2 || true
      exit 1
    fi
    (( SECONDS < deadline )) || { echo "up.sh: timed out waiting for $3" >&2; exit 1; }
    sleep 0.1
  done
}

rm -f "$run_dir"/*.port
certs="$run_dir/certs"
if [[ "$insecure" == 1 ]]; then
  router_sec=(--insecure)
  cli_sec=(--insecure)
  worker_sec() { echo --insecure; }
else
  # Every worker gets its own certificate (naming its --worker_id): KV leases are bound to the
  # decode worker they are for, which proves who it is with it.
  workers=()
  for r in prefill decode mixed; do
    for ((i = 0; i < ${!r}; i++)); do workers+=(--worker="$r-$i:$r"); done
  done
  "$(dirname "$0")/../certs/make_certs.sh" "$certs" --api_key ${workers[@]+"${workers[@]}"} > /dev/null
  router_sec=(--tls_cert="$certs/router.pem" --tls_key="$certs/router.key" --tls_ca="$certs/ca.pem"
              --api_key_file="$certs/api_keys" --internal_listen=127.0.0.1:0
              --internal_port_file="$run_dir/internal.port")
  # up.sh itself waits on ListWorkers: the operator key.
  cli_sec=(--tls_ca="$certs/ca.pem" --api_key="$(cat "$certs/admin_api_key")")
  worker_sec() {  # worker_sec WORKER_ID: its own certificate (paths without spaces: unquoted)
    echo --tls_cert="$certs/$1.pem" --tls_key="$certs/$1.key" --tls_ca="$certs/ca.pem"
  }
fi
http_flags=()
if [[ -n "$http_port" ]]; then
  http_model="${http_model:-$model}"
  [[ -n "$http_model" ]] || { echo "up.sh: --http_port needs --http_model=DIR or --model" >&2; exit 2; }
  http_flags=(--http_listen="127.0.0.1:$http_port" --model="$http_model"
              --http_port_file="$run_dir/http.port")
fi
"$router_bin" --listen="127.0.0.1:$router_port" --port_file="$run_dir/router.port" \
  "${router_sec[@]}" ${http_flags[@]+"${http_flags[@]}"} > "$run_dir/router.log" 2>&1 &
echo "$! router" >> "$run_dir/pids"
wait_file "$run_dir/router.port" "$!" router
router_addr="$(cat "$run_dir/router.port")"
internal_addr="$router_addr"
if [[ "$insecure" == 0 ]]; then
  wait_file "$run_dir/internal.port" "$(awk '$2 == "router" {print $1}' "$run_dir/pids")" router
  internal_addr="$(cat "$run_dir/internal.port")"
fi

start_worker() {  # start_worker ROLE INDEX
  local name="$1-$2" tp=1 dcp=1 ep=0 dpa=0 spec_flags=() ep_flags=()
  case "$1" in
    prefill)
      tp=$prefill_tp ep=$prefill_ep dpa=$prefill_dpa
      # MTP: P runs the MTP layer over its prompts for D's drafter (it never drafts).
      [[ " ${spec[*]-} " == *" --speculative_method=mtp "* ]] && spec_flags=("${spec[@]}")
      ;;
    decode) tp=$decode_tp dcp=$decode_dcp ep=$decode_ep dpa=$decode_dpa spec_flags=(${spec[@]+"${spec[@]}"}) ;;
    mixed) tp=$mixed_tp dcp=$mixed_dcp ep=$mixed_ep dpa=$mixed_dpa spec_flags=(${spec[@]+"${spec[@]}"}) ;;
  esac
  [[ $ep == 1 ]] && ep_flags=(--enable_expert_parallel)
  [[ $dpa == 1 ]] && ep_flags=(--enable_expert_parallel --dp_attention)
  "$worker_bin" --role="$1" --tp="$tp" --dcp="$dcp" --backend="$backend" "${model_flags[@]}" \
    ${ep_flags[@]+"${ep_flags[@]}"} ${spec_flags[@]+"${spec_flags[@]}"} \
    --router="$internal_addr" $(worker_sec "$name") \
    --worker_id="$name" --listen=127.0.0.1:0 --port_file="$run_dir/$name.port" \
    ${extra[@]+"${extra[@]}"} > "$run_dir/$name.log" 2>&1 &
  echo "$! $name" >> "$run_dir/pids"
}
total=0
for ((i = 0; i < prefill; i++)); do start_worker prefill "$i"; total=$((total + 1)); done
for ((i = 0; i < decode; i++)); do start_worker decode "$i"; total=$((total + 1)); done
for ((i = 0; i < mixed; i++)); do start_worker mixed "$i"; total=$((total + 1)); done
while read -r pid name; do
  [[ "$name" == router ]] || wait_file "$run_dir/$name.port" "$pid" "$name"
done < "$run_dir/pids"

# Ready when the router lists every worker as healthy.
deadline=$((SECONDS + timeout_s))
while true; do
  healthy="$("$cli_bin" workers --router="$router_addr" "${cli_sec[@]}" --json 2>/dev/null |
    grep -o '"healthy":true' | wc -l || true)"
  [[ "$healthy" -ge "$total" ]] && break
  (( SECONDS < deadline )) || { echo "up.sh: only $healthy/$total workers healthy" >&2; exit 1; }
  sleep 0.2
done
echo "router: $router_addr"
if [[ "$insecure" == 0 ]]; then
  echo "internal: $internal_addr"
  echo "tls_ca: $certs/ca.pem"
  echo "api_key_file: $certs/api_key"
  echo "admin_api_key_file: $certs/admin_api_key"
fi
if [[ -n "$http_port" ]]; then
  wait_file "$run_dir/http.port" "$(awk '$2 == "router" {print $1}' "$run_dir/pids")" router
  http_scheme=https
  [[ "$insecure" == 1 ]] && http_scheme=http
  echo "http: $http_scheme://$(cat "$run_dir/http.port")"
fi
echo "workers: $prefill prefill, $decode decode, $mixed mixed (logs and pids in $run_dir)"
