#!/usr/bin/env bash
# Mixture-of-experts models served prefill -> decode through the router on CUDA workers, their
# greedy tokens checked (issue 32: "MoE models served P->D through the router" on CUDA; the CPU
# form is tests/e2e/moe_serving_e2e_test.cc). For each MoE golden fixture (tests/golden/fixtures:
# qwen3_moe_f32, mixtral_f32, qwen2_moe_f32; tests/golden/fixtures_mla: deepseek_v3_moe_f32,
# deepseek_v2_moe_f32, MLA with MoE layers), every row its own tandem_router and workers on
# loopback, all the fixture's prompts (1 to 64 tokens, 16 greedy tokens each, one at a time):
#   mixed     one mixed worker (GPU 0): the reference tokens. Against transformers
#             (expected.json) by the CUDA golden rule's token part (cuda_golden_lib.sh): the first
#             greedy token equal wherever transformers' top-2 gap is >= 3% of max|logit| (a
#             prompt in the fixture's routing_near_ties.json may match the other side of the
#             tie instead); the whole greedy sequences are compared and printed, not required
#             (bf16 drifts from fp32: the MoE fixtures' router gaps go down to 1e-4).
#   ucx       prefill worker on GPU 0 -> decode worker on GPU 1 (GPU 0 with one GPU), KV
#             over UCX (staged through host memory); nccl: the same over NCCL (device to
#             device). Tokens must equal the mixed worker's (same kernels, same bf16 KV), and
#             the decode worker must have received KV bytes with no load failure and no
#             recompute.
#   ep_ucx    prefill TP=1 on GPU 0 -> a decode group of 2 expert-parallel ranks (--tp=2
#   ep_nccl   --enable_expert_parallel on GPUs 2, 3, or 1, 2 with 3 GPUs: KV heads re-sharded
#             on the read, experts whole on each rank), KV over UCX / NCCL: KV received on
#             every rank, no recompute, the placement logged, the first token (the prefill
#             worker's) equal to the mixed worker's. TP=2 rounds differently from TP=1 in bf16,
#             so later tokens are compared with the mixed worker's and transformers' and
#             printed, not required; the two transports must give the same tokens
#             (ep_transports_agree: the same prefill KV, the same decode group).
#   spec_ucx  prefill GPU 0 -> a decode worker (GPU 1) that speculates (issue 34: a P->D decode
#             worker speculating on KV it received), draft = the target itself, K = 3, KV over
#             UCX: KV received, no recompute, drafts verified and accepted (the worker's
#             spec_draft_tokens / spec_accepted_tokens), the first token equal to the mixed
#             worker's; later tokens printed (a K + 1-token verify pass rounds differently from a
#             one-token step in bf16), equal to transformers' on the CPU. Llama-family fixtures
#             only; an MLA checkpoint that carries an MTP layer (model.layers.N.eh_proj, e.g.
#             fixtures_fp8/fp8_deepseek_v3) drafts with it instead, P started with the same MTP
#             flags (it hands its MTP state of the prompt over): drafted > 0 required, accepted
#             printed (random MTP weights accept ~0); the other MLA fixtures are skipped
#             (mtp_cuda_golden.sh's).
#   spec_mixed  (a checkpoint with an MTP layer only) a mixed worker drafting with it, K = 3:
#             greedy tokens equal to the mixed worker's without drafts, drafted > 0, accepted
#             printed. FP8 weights on CUDA: a one-token step runs the W8A16 GEMV (bf16
#             activations, kFp8W16GemvMaxM = 1) and the K + 1-token verify pass the W8A8 one
#             (quantized activations), so they round differently and only the first tokens are
#             required (the rest printed); then both mixed workers again with
#             TANDEM_FP8_W16_GEMV=0 (W8A8 everywhere): whole sequences must be equal there
#             (spec_mixed_w8a8_same_tokens).
#   mismatch  (a FIX:fp8 entry only) prefill worker on the bf16 weights, decode worker with
#             --quantization=fp8: their compatibility hashes differ (the model id carries the
#             weights' quantization), so the router pairs them not ("none compatible") and no KV
#             byte moves.
# FP8 weights (issue 38, tests/gpu/fp8_cuda_golden.sh's pd part): an entry of FIXTURES may be a
# directory (e.g. the head_dim-64 formats fp8_cuda_golden.sh writes) or a name under
# tests/golden/fixtures{,_mla,_fp8}, and ":fp8" after it quantizes it at load on every worker
# (--quantization=fp8). A fixture's expected.json that records only 4 greedy tokens (the FP8
# ones) is compared on those; where it has transformers' activation-quantizing reference
# (greedy_tokens_act_quant: what the engines compute), the transformers rule reads that one, else
# it holds FP8 weights' first tokens to the unquantized reference only where its top-2 gap is
# >= 15% of max|logit| (TOKENS_VS_HF=first; "exact" is for 16/32-bit fixtures).
# BACKEND=cpu (env) rehearses it on the CPU backend (fp32, no --device, NCCL rows skipped):
# there every row's tokens must equal transformers' exactly (TOKENS_VS_HF=exact, the default on
# the CPU; "first" on CUDA). Fixtures run as parallel chains (PARALLEL=1, the CUDA default), each
# under CHAIN_S seconds (default 90), chain k with its GPUs rotated by k. Decode runs eager
# (CUDA_GRAPHS=false, the default here: faster starts; moe_cuda_golden.sh checks graphs = eager).
#
#   [BACKEND=cpu] [FIXTURES="qwen3_moe_f32 DIR NAME:fp8 ..."] \
#     [ROWS="ucx nccl ep_ucx ep_nccl spec_ucx spec_mixed mismatch"] \
#     tests/gpu/moe_pd_cuda_golden.sh BUNDLE_DIR LOG_DIR
#
# BUNDLE_DIR: tests/gpu/bundle.sh with tool//runtime:tandem_worker tool//router:tandem_router
# tool//router:tandem_cli (or a directory with runtime/ and router/ holding them: bazel-bin).
# Run from the repository root. GPUs: ucx 1, nccl 2, ep_* 3 (fewer: the row is skipped); the
# chains share them (tiny models, 64 MiB KV pools). Every port on 127.0.0.1.
# Prints one PASS / FAIL / SKIP line a row and "N passed, M failed, K skipped"; exits non-zero on
# a failure.
set -uo pipefail
MODE=main
if [[ ${1:-} == --chain ]]; then MODE=chain FIX=$2; shift 2; fi
B=$(cd "${1:?bundle dir}" && pwd)
LOG=${2:?log dir}
mkdir -p "$LOG" && LOG=$(cd "$LOG" && pwd)
BIN=$B/bin
[[ -d $BIN/runtime ]] || BIN=$B
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
# NCCL's own bootstrap sockets on loopback too (the workers bind theirs to 127.0.0.1 by flag).
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
W=$BIN/runtime/tandem_worker R=$BIN/router/tandem_router C=$BIN/router/tandem_cli
BACKEND=${BACKEND:-cuda}
if [[ $BACKEND == cpu ]]; then
  gpus=0 TOKENS_VS_HF=${TOKENS_VS_HF:-exact} PARALLEL=${PARALLEL:-0}
else
  # The GPUs: CUDA_VISIBLE_DEVICES's where set (a chain's: the caller's list rotated), else all.
  if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
    IFS=, read -ra gpu_ids <<<"$CUDA_VISIBLE_DEVICES"
  else
    mapfile -t gpu_ids < <(nvidia-smi -L 2>/dev/null | grep -o '^GPU [0-9]*' | cut -d' ' -f2)
  fi
  gpus=${#gpu_ids[@]}
  TOKENS_VS_HF=${TOKENS_VS_HF:-first} PARALLEL=${PARALLEL:-1}
fi
FIXTURES=${FIXTURES:-qwen3_moe_f32 mixtral_f32 qwen2_moe_f32 deepseek_v3_moe_f32
  deepseek_v2_moe_f32}
ROWS=" ${ROWS:-ucx nccl ep_ucx ep_nccl spec_ucx} "
chain_name() {  # FIXTURES entry: its chain's log name (the directory's name, -fp8 for FIX:fp8)
  local n=${1%:fp8}
  n=${n%/}
  echo "${n##*/}$([[ $1 == *:fp8 ]] && echo -fp8)"
}

if [[ $MODE == main ]]; then
  nvidia-smi -L >/dev/null 2>&1 || [[ $BACKEND == cpu ]] || gpus=0
  if [[ $BACKEND != cpu && $gpus -lt 1 ]]; then
    echo "no GPU: skipped"; echo "0 passed, 0 failed, 1 skipped"; exit 0
  fi
  t0=$SECONDS k=0 chains=()
  for fix in $FIXTURES; do
    # Chain k sees the GPUs rotated by k, so the chains' prefill and decode workers spread out.
    vis= name=$(chain_name "$fix")
    for ((i = 0; i < gpus; i++)); do vis+=${vis:+,}${gpu_ids[(i + k) % gpus]}; done
    cmd=(env CUDA_VISIBLE_DEVICES="$vis" timeout -k 5 "${CHAIN_S:-90}" "$0" --chain "$fix" "$B"
         "$LOG/$name")
    [[ $BACKEND == cpu ]] && cmd=("${cmd[@]:2}")
    if [[ $PARALLEL == 1 ]]; then
      "${cmd[@]}" >"$LOG/$name.txt" 2>&1 &
      chains+=($!)
    else
      "${cmd[@]}" >"$LOG/$name.txt" 2>&1
    fi
    k=$((k + 1))
  done
  for p in ${chains[@]+"${chains[@]}"}; do wait "$p"; done
  # A chain killed at its limit leaves its rows' process groups (each its own session): end them.
  cat "$LOG"/*/pgids 2>/dev/null | while read -r p; do kill -KILL -- "-$p" 2>/dev/null; done
  passed=0 failed=0 skipped=0
  for fix in $FIXTURES; do
    name=$(chain_name "$fix")
    grep -E "^(PASS|FAIL|SKIP|  )" "$LOG/$name.txt"
    if ! grep -q "^chain done" "$LOG/$name.txt"; then
      echo "FAIL $name (chain stopped at ${CHAIN_S:-90} s)"
      failed=$((failed + 1))
    fi
    passed=$((passed + $(grep -c "^PASS" "$LOG/$name.txt")))
    failed=$((failed + $(grep -c "^FAIL" "$LOG/$name.txt")))
    skipped=$((skipped + $(grep -c "^SKIP" "$LOG/$name.txt")))
  done
  echo "$BACKEND, $gpus GPUs, $((SECONDS - t0)) s"
  echo "$passed passed, $failed failed, $skipped skipped"
  [[ $failed -eq 0 && $passed -gt 0 ]]
  exit
fi

# ---- one fixture's chain of rows: --chain FIX BUNDLE_DIR LOG_DIR ----
FIX_FLAGS=()  # on every worker of the chain (FIX:fp8: online FP8)
[[ $FIX == *:fp8 ]] && FIX_FLAGS=(--quantization=fp8)
MODEL=${FIX%:fp8} FIX=$(chain_name "$FIX")
for d in "$MODEL" tests/golden/fixtures{,_mla,_fp8}/"$MODEL"; do
  [[ -f $d/expected.json ]] && MODEL=$d && break
done
[[ -f $MODEL/expected.json ]] || { echo "FAIL $FIX (no fixture)"; exit 1; }
echo "$FIX: $BACKEND, GPUs ${CUDA_VISIBLE_DEVICES:-none} ($gpus)"
pids=()
stop_row() {  # every process group this row started (router, workers and their TP ranks)
  local p i
  for p in ${pids[@]+"${pids[@]}"}; do kill -TERM -- "-$p" 2>/dev/null; done
  for i in $(seq 1 50); do
    local alive=0
    for p in ${pids[@]+"${pids[@]}"}; do kill -0 "$p" 2>/dev/null && alive=1; done
    [[ $alive == 0 ]] && break
    sleep 0.1
  done
  for p in ${pids[@]+"${pids[@]}"}; do kill -KILL -- "-$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  pids=()
}
trap 'stop_row; exit 1' TERM INT
trap stop_row EXIT
wait_file() { for _ in $(seq 1 300); do [[ -s $1 ]] && return 0; sleep 0.1; done; return 1; }
passed=0
pass() { echo "PASS $FIX/$1"; passed=$((passed + 1)); }
fail() {  # NAME [LOG]: the verdict, and LOG's last lines (not the --insecure banner)
  echo "FAIL $FIX/$1"
  [[ -z ${2:-} ]] || grep -v "flags.cc:" "$2" | tail -n 3 | sed 's/^/  /'
}
skip() { echo "SKIP $FIX/$1 ($2)"; }

DIR='' ROUTER=''
row_start() {  # TAG: a router of its own in $LOG/TAG
  DIR=$LOG/$1
  mkdir -p "$DIR"
  rm -f "$DIR"/*.port  # a LOG_DIR used before: its port files name routers and workers gone
  setsid "$R" --insecure --listen=127.0.0.1:0 --port_file="$DIR/router.port" \
    >"$DIR/router.log" 2>&1 &
  pids+=($!)
  echo $! >>"$LOG/pgids"
  wait_file "$DIR/router.port" && ROUTER=$(cat "$DIR/router.port")
}
worker() {  # NAME ROLE FLAGS...: a worker of this row's router (its own process group)
  local name=$1 role=$2 flags=(--num_threads=1)
  shift 2
  [[ $BACKEND == cpu ]] || flags=(--cuda_graphs="${CUDA_GRAPHS:-false}")
  [[ $name == prefill && -n ${PLAIN_PREFILL:-} ]] || flags+=(${FIX_FLAGS[@]+"${FIX_FLAGS[@]}"})
  setsid "$W" --insecure --role="$role" --worker_id="$FIX-$name" --backend="$BACKEND" \
    --model="$MODEL" --router="$ROUTER" --kv_cache_bytes=67108864 --listen=127.0.0.1:0 \
    --port_file="$DIR/$name.port" "${flags[@]}" "$@" >"$DIR/$name.log" 2>&1 &
  pids+=($!)
  echo $! >>"$LOG/pgids"
}
healthy() {  # N: waits (60 s at most) until N workers are healthy at the router
  local i n p
  for i in $(seq 1 300); do
    n=$("$C" --insecure workers --router="$ROUTER" --json 2>/dev/null | grep -o '"healthy":true' |
        wc -l)
    [[ $n -ge $1 ]] && return 0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || break 2; done  # one exited
    sleep 0.2
  done
  echo "only $n of $1 workers healthy after $((i / 5)) s"
  tail -n 3 "$DIR"/*.log
  return 1
}
gen_all() {  # every prompt of the fixture, one at a time: $DIR/tokens.json (a list a prompt)
  local p i=0 t=$SECONDS
  : >"$DIR/gen.jsonl"
  while read -r p; do
    timeout 30 "$C" --insecure generate --router="$ROUTER" --prompt_ids="$p" --max_tokens=16 \
      --ignore_eos --timeout_ms=25000 --json >>"$DIR/gen.jsonl" 2>"$DIR/gen.err" ||
      { echo "prompt $i: generate failed"; cat "$DIR/gen.err"; return 1; }
    i=$((i + 1))
  done < <(python3 -c "import json; [print(','.join(map(str, p))) for p in \
json.load(open('$MODEL/expected.json'))['prompts']]")
  python3 -c "import json; t = [json.loads(l)['tokens'] for l in open('$DIR/gen.jsonl')]; \
json.dump(t, open('$DIR/tokens.json', 'w'))"
  echo "$i prompts generated in $((SECONDS - t)) s"
}
judge() {  # RULE GOT [REF]: RULE hf (vs transformers), same (== REF), first (first tokens == REF)
  python3 - "$MODEL" "$TOKENS_VS_HF" "${#FIX_FLAGS[@]}" "$@" <<'PY'
import json, os, sys
model, vs_hf, online_fp8, rule, got_path = sys.argv[1:6]
got = json.load(open(got_path))
exp = json.load(open(f"{model}/expected.json"))
# FP8 weights: transformers quantizing activations as the engines do, where the fixture has it.
fp8 = online_fp8 != "0" or "quantization_config" in json.load(open(f"{model}/config.json"))
aq = "_act_quant" if fp8 and "greedy_tokens_act_quant" in exp else ""
hf, n = exp["greedy_tokens" + aq], len(exp["prompts"])
logits = exp["last_prompt_logits" + aq]
# Without it, the reference keeps activations unquantized: DeepSeek's 1 x 128 activation
# quantization moved fp8_deepseek_v3's prompt 0 by > 6% of max|logit| on the CPU, so only first
# tokens whose top-2 gap is >= 15% of max|logit| are held to it.
gap_min = 0.15 if fp8 and not aq else 0.03
ties = f"{model}/routing_near_ties.json"
ties = json.load(open(ties))["prompts"] if os.path.exists(ties) else [{}] * n
def prefixes(a, b):
    out = []
    for x, y in zip(a, b):
        k = 0
        while k < len(x) and k < len(y) and x[k] == y[k]: k += 1
        out.append(k)
    return out
bad = []
if len(got) != n or any(len(g) < len(h) for g, h in zip(got, hf)):
    bad.append(f"token counts {[len(g) for g in got]}")
ref = json.load(open(sys.argv[6])) if len(sys.argv) > 6 else None
got_hf = [g[:len(h)] for g, h in zip(got, hf)]  # the FP8 fixtures record 4 tokens a prompt
if rule == "hf" and vs_hf == "exact" and got_hf != hf:
    bad.append("tokens differ from transformers'")
if rule == "hf" and vs_hf == "first":  # the CUDA golden rule's first token
    for i, (g, h) in enumerate(zip(got, hf)):
        top = sorted(logits[i], reverse=True)
        m = max(abs(x) for x in logits[i])
        alts = [a["last_prompt_logits"] for a in ties[i].get("alternatives", [])]
        ok = {h[0]} | {a.index(max(a)) for a in alts}
        if top[0] - top[1] >= gap_min * m and g[:1] and g[0] not in ok:
            bad.append(f"prompt {i}: first token {g[0]} not transformers' {sorted(ok)}")
if rule == "same" and got != ref:
    bad.append("tokens differ from the reference's")
if rule == "first" and [g[:1] for g in got] != [r[:1] for r in ref]:
    bad.append("first tokens differ from the reference's")
line = f"{rule}: equal to transformers{aq} on {sum(g == h for g, h in zip(got_hf, hf))}/{n} "
line += f"(prefixes {prefixes(got_hf, hf)})"
if ref is not None:
    line += f", to the reference on {sum(g == r for g, r in zip(got, ref))}/{n} (prefixes "
    line += f"{prefixes(got, ref)})"
print(line)
for b in bad: print(b)
sys.exit(1 if bad else 0)
PY
}
kv_moved() {  # NAME: the decode worker NAME received KV, no load failure, no recompute
  "$C" --insecure stats --worker="$(cat "$DIR/$1.port")" --json >"$DIR/$1.stats.json" || return 1
  python3 - "$DIR/$1.stats.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
keys = ("kv_bytes_received", "kv_bytes_received_per_rank", "kv_load_failures", "kv_recomputes",
        "moe_expert_tokens")
print({k: j.get(k) for k in keys})
ranks = [int(x) for x in j.get("kv_bytes_received_per_rank", [])]  # every decode rank read its KV
sys.exit(0 if int(j.get("kv_bytes_received", 0)) > 0 and int(j.get("kv_load_failures", 0)) == 0
         and int(j.get("kv_recomputes", 0)) == 0 and all(n > 0 for n in ranks) else 1)
PY
}
spec_counted() {  # NAME MIN_ACCEPTED: the decode worker NAME drafted tokens, accepted that many
  python3 - "$DIR/$1.stats.json" "$2" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
d, a = int(j.get("spec_draft_tokens", 0)), int(j.get("spec_accepted_tokens", 0))
h = int(j.get("spec_mtp_handoffs", 0))
print(f"drafted {d}, accepted {a}, verify passes {j.get('spec_verify_passes')}, MTP handoffs {h}")
sys.exit(0 if d > 0 and a >= int(sys.argv[2]) else 1)
PY
}
refused() {  # the row's one prompt failed unpaired and the decode worker received no KV
  ! timeout 30 "$C" --insecure generate --router="$ROUTER" --prompt_ids=5,6,7 --max_tokens=4 \
    --timeout_ms=25000 --json >"$DIR/gen.jsonl" 2>"$DIR/gen.err" &&
    grep -h "none compatible" "$DIR/gen.err" &&
    "$C" --insecure stats --worker="$(cat "$DIR/decode.port")" --json >"$DIR/decode.stats.json" &&
    python3 -c "import json, sys; n = int(json.load(open('$DIR/decode.stats.json')).get(\
'kv_bytes_received', 0)); print('decode KV bytes received', n); sys.exit(n != 0)"
}
check() {  # NAME CMD...: PASS / FAIL line for CMD's status, its output indented in the log
  local name=$1
  shift
  if "$@" >"$DIR/$name.check" 2>&1; then pass "$name"; else fail "$name"; fi
  sed 's/^ */  /' "$DIR/$name.check"
}

dev() { [[ $BACKEND == cpu ]] || echo "--device=$1"; }  # a worker's GPU flag (none on the CPU)
# mixed: the reference tokens.
t_row=$SECONDS
# shellcheck disable=SC2046  # dev: one flag or none
if row_start mixed && worker mixed mixed $(dev 0) && healthy 1 && gen_all; then
  cp "$DIR/tokens.json" "$LOG/mixed.json"
  check mixed_vs_transformers judge hf "$LOG/mixed.json"
else
  fail mixed "$DIR/mixed.log"
fi
stop_row
echo "mixed: $((SECONDS - t_row)) s"
MTP=()  # an MLA checkpoint's own MTP layer (model.layers.N.eh_proj) drafting, where it has one
FP8_WEIGHTS=0  # FP8 weights: a checkpoint's quantization_config, or FIX:fp8
grep -q '"quantization_config"' "$MODEL/config.json" && FP8_WEIGHTS=1
[[ ${#FIX_FLAGS[@]} -gt 0 ]] && FP8_WEIGHTS=1
grep -qa "eh_proj.weight" "$MODEL"/*.safetensors && MTP=(--speculative_method=mtp --num_speculative_tokens=3)
if [[ $ROWS != *" spec_mixed "* ]]; then
  :
elif [[ ${#MTP[@]} == 0 ]]; then
  skip spec_mixed "no MTP layer in the checkpoint"
else  # greedy with MTP drafts on a mixed worker: the mixed worker's tokens without them
  t_row=$SECONDS
  # shellcheck disable=SC2046  # dev: one flag or none
  if row_start spec_mixed && worker mixed mixed $(dev 0) "${MTP[@]}" && healthy 1 && gen_all; then
    cp "$DIR/tokens.json" "$LOG/spec_mixed.json"
    "$C" --insecure stats --worker="$(cat "$DIR/mixed.port")" --json >"$DIR/mixed.stats.json"
    check spec_mixed_drafted spec_counted mixed 0
    if [[ $FP8_WEIGHTS == 0 || $BACKEND == cpu ]]; then
      check spec_mixed_same_tokens_as_mixed judge same "$LOG/spec_mixed.json" "$LOG/mixed.json"
    else  # one-token steps: the W8A16 GEMV; the K + 1-token verify pass: W8A8 (see above)
      check spec_mixed_first_tokens judge first "$LOG/spec_mixed.json" "$LOG/mixed.json"
    fi
  else
    fail spec_mixed "$DIR/mixed.log"
  fi
  stop_row
  if [[ $FP8_WEIGHTS == 1 && $BACKEND != cpu ]]; then  # both on W8A8: the same tokens again
    export TANDEM_FP8_W16_GEMV=0
    for tag in w8a8_mixed w8a8_spec_mixed; do
      flags=()
      [[ $tag == w8a8_spec_mixed ]] && flags=("${MTP[@]}")
      # shellcheck disable=SC2046  # dev: one flag or none
      if row_start "$tag" && worker mixed mixed $(dev 0) ${flags[@]+"${flags[@]}"} && healthy 1 &&
         gen_all; then
        cp "$DIR/tokens.json" "$LOG/$tag.json"
      else
        fail "$tag" "$DIR/mixed.log"
      fi
      stop_row
    done
    unset TANDEM_FP8_W16_GEMV
    if [[ -s $LOG/w8a8_mixed.json && -s $LOG/w8a8_spec_mixed.json ]]; then
      check spec_mixed_w8a8_same_tokens judge same "$LOG/w8a8_spec_mixed.json" "$LOG/w8a8_mixed.json"
    fi
  fi
  echo "spec_mixed: $((SECONDS - t_row)) s"
fi
PREFILL_FLAGS=()  # the spec row's prefill worker: the MTP flags (it hands its MTP state over)
pd_row() {  # TAG TRANSPORT DECODE_DEVICE DECODE_FLAGS...
  local tag=$1 tr=$2 ddev=$3 t=$SECONDS accepted=1
  shift 3
  [[ ${PREFILL_FLAGS[*]:-} == *mtp* ]] && accepted=0
  # shellcheck disable=SC2046  # dev: one flag or none
  if row_start "$tag" &&
     worker prefill prefill --kv_transport="$tr" $(dev 0) ${PREFILL_FLAGS[@]+"${PREFILL_FLAGS[@]}"} &&
     worker decode decode --kv_transport="$tr" $(dev "$ddev") "$@" && healthy 2 && gen_all; then
    cp "$DIR/tokens.json" "$LOG/$tag.json"
    check "${tag}_kv_moved" kv_moved decode
    if [[ $tag == ep_* || $tag == spec_* ]]; then
      [[ $tag == ep_* ]] && check "${tag}_placement" grep -h "expert parallelism, " "$DIR/decode.log"
      [[ $tag == spec_* ]] && check "${tag}_drafts_accepted" spec_counted decode "$accepted"
      check "${tag}_first_tokens" judge first "$LOG/$tag.json" "$LOG/mixed.json"
    else
      check "${tag}_same_tokens_as_mixed" judge same "$LOG/$tag.json" "$LOG/mixed.json"
    fi
    [[ $TOKENS_VS_HF == exact ]] && check "${tag}_vs_transformers" judge hf "$LOG/$tag.json"
  else
    fail "$tag" "$DIR/decode.log"
  fi
  stop_row
  echo "$tag: $((SECONDS - t)) s"
}
for tag in ucx nccl ep_ucx ep_nccl spec_ucx mismatch; do
  [[ $ROWS == *" $tag "* ]] || continue
  tr=${tag#ep_} need=1
  tr=${tr#spec_}  # GPUs: UCX P and D may share one; NCCL one a rank; EP D on 2 more
  [[ $tr == nccl ]] && need=2
  [[ $tag == ep_* ]] && need=3
  if [[ $tr == nccl && $BACKEND == cpu ]]; then
    skip "$tag" "NCCL needs --backend=cuda"
  elif [[ $BACKEND != cpu && $gpus -lt $need ]]; then
    skip "$tag" "$gpus GPUs, $need needed"
  elif [[ $tag == ep_* ]]; then
    pd_row "$tag" "$tr" $((gpus > 3 ? 2 : 1)) --tp=2 --enable_expert_parallel
  elif [[ $tag == mismatch ]]; then
    if [[ ${#FIX_FLAGS[@]} == 0 ]]; then
      skip "$tag" "not a FIX:fp8 chain"
    else
      t_row=$SECONDS
      # shellcheck disable=SC2046  # dev: one flag or none
      if row_start "$tag" && PLAIN_PREFILL=1 worker prefill prefill $(dev 0) &&
         worker decode decode $(dev 0) && healthy 2; then
        check mismatch_not_paired refused
      else
        fail "$tag" "$DIR/decode.log"
      fi
      stop_row
      echo "$tag: $((SECONDS - t_row)) s"
    fi
  elif [[ $tag == spec_* ]]; then
    if [[ ${#MTP[@]} != 0 ]]; then
      PREFILL_FLAGS=("${MTP[@]}")
      pd_row "$tag" "$tr" $((gpus > 1 ? 1 : 0)) "${MTP[@]}"
      PREFILL_FLAGS=()
    elif [[ $MODEL == */fixtures_mla/* ]]; then
      skip "$tag" "MLA fixture without an MTP layer (mtp_cuda_golden.sh)"
    else
      pd_row "$tag" "$tr" $((gpus > 1 ? 1 : 0)) --speculative_method=draft --draft_model="$MODEL" \
        --num_speculative_tokens=3
    fi
  else
    pd_row "$tag" "$tr" $((gpus > 1 ? 1 : 0))
  fi
done
if [[ -f $LOG/ep_ucx.json && -f $LOG/ep_nccl.json ]]; then
  DIR=$LOG check ep_transports_agree judge same "$LOG/ep_nccl.json" "$LOG/ep_ucx.json"
fi
echo "chain done: $passed passed"
