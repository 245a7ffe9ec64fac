# Shared by the CUDA golden scripts (tp_cuda_golden.sh, dcp_cuda_golden.sh); sourced, not run.
# Sets B (bundle), LOG, G (generate), SHARE, the pass/fail/skip counters; exits with "skipped"
# when there is no GPU. compare NAME OUT REF [EXPECTED_JSON [NEAR_TIES_JSON]]: the CUDA TP rule
# (last-prompt logits cosine >= 0.999 to the reference run and to transformers; first greedy
# token equal to the reference wherever its top-2 gap is >= 3% of max|logit|; a prompt whose MoE
# routing is a bf16 near-tie may match the other side's logits instead, named in the output),
# reporting the largest |logit difference| and the equal token prefixes. run OUT ARGS...: generate on the GPU.
# prompts_of EXPECTED_JSON: its prompts as --prompt_ids takes them. same_tokens LABEL A B: the
# greedy tokens of two runs equal, prompt by prompt ("LABEL: n/N prompts with equal tokens").
# pass NAME / fail NAME ERR_FILES...: a check's verdict line and count (fail also shows the last
# 3 lines of each ERR_FILE). tokens_check NAME LABEL OUT REF ARGS...: run OUT ARGS..., then PASS
# NAME where its greedy tokens equal REF's (same_tokens LABEL), e.g. eager decode against graphs.
B=$(cd "${1:?bundle dir}" && pwd)
LOG=${2:?log dir}
mkdir -p "$LOG"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
G=$B/bin/runtime/generate
SHARE=${SHARE---tp_share_device}
passed=0 failed=0 skipped=0
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "no GPU: skipped"; echo "0 passed, 0 failed, 1 skipped"; exit 0
fi

compare() {  # NAME OUT REF [EXPECTED_JSON [NEAR_TIES_JSON]]
  python3 - "$@" <<'PY'
import json, math, os, sys
name, out, ref = sys.argv[1:4]
# COMPARE_MIN_COSINE / COMPARE_FIRST_TOKEN_GAP (env): a looser rule where the run is stated to
# be coarser (FP8 latent KV: mla_fp8_cuda_golden.sh); defaults 0.999 / 0.03.
min_cos = float(os.environ.get("COMPARE_MIN_COSINE", "0.999"))
first_gap = float(os.environ.get("COMPARE_FIRST_TOKEN_GAP", "0.03"))
exp = json.load(open(sys.argv[4])) if len(sys.argv) > 4 and sys.argv[4] else None
# tests/golden/moe_routing_near_ties.py: per prompt, the logits of the other side of a MoE routing
# near-tie (a last-token margin under the bf16 noise); such a prompt passes by matching one of them.
ties = json.load(open(sys.argv[5]))["prompts"] if len(sys.argv) > 5 else None
got = [json.loads(l) for l in open(out) if l.strip()]
want = [json.loads(l) for l in open(ref) if l.strip()]
assert len(got) == len(want) > 0
def cos(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
bad, same_tokens, worst_ref, worst_hf, worst_diff, prefix, near = 0, 0, 1.0, 1.0, 0.0, [], 0
for i, (g, w) in enumerate(zip(got, want)):
    lg, lw = g["last_prompt_logits"], w["last_prompt_logits"]
    m = max(abs(x) for x in lw)
    worst_diff = max(worst_diff, max(abs(a - b) for a, b in zip(lg, lw)) / m)
    c, first = cos(lg, lw), w["tokens"][0]
    ch = cos(lg, exp["last_prompt_logits"][i]) if exp is not None else 1.0
    alts = ties[i]["alternatives"] if ties is not None else []
    if (c < min_cos or ch < min_cos) and alts:
        best = max(alts, key=lambda a: cos(lg, a["last_prompt_logits"]))
        cb = cos(lg, best["last_prompt_logits"])
        if cb >= min_cos:
            t = ties[i]
            print(f"{name} prompt {i}: routing near-tie (expert gap {t['expert_gap']:.1e}, group gap"
                  f" {t['group_gap']:.1e}): the other side's logits ('{best['what']}', experts "
                  f"{best['experts']} for {t['experts_f32']}) cosine {cb:.5f} (to tp=1 {c:.5f}, to "
                  f"transformers {ch:.5f})")
            near += 1; c = ch = cb; lw = best["last_prompt_logits"]; first = lw.index(max(lw))
    worst_ref = min(worst_ref, c)
    if c < min_cos: print(f"{name} prompt {i}: cosine to tp=1 {c:.5f}"); bad += 1
    if exp is not None:
        worst_hf = min(worst_hf, ch)
        if ch < min_cos: print(f"{name} prompt {i}: cosine to transformers {ch:.5f}"); bad += 1
    top = sorted(lw, reverse=True)
    if top[0] - top[1] >= first_gap * m and g["tokens"][0] != first:
        print(f"{name} prompt {i}: first token {g['tokens'][0]} != tp=1 {first}"); bad += 1
    same_tokens += g["tokens"] == w["tokens"]
    k = 0
    while k < len(w["tokens"]) and g["tokens"][k:k + 1] == w["tokens"][k:k + 1]: k += 1
    prefix.append(k)
print(f"{name}: {len(got)} prompts, cosine to tp=1 >= {worst_ref:.6f}"
      + (f", to transformers >= {worst_hf:.6f}" if exp else "")
      + f", max |logit - tp=1| {worst_diff:.2e} of max"
      + f", greedy tokens equal to tp=1 on {same_tokens}/{len(got)} (equal prefix {prefix})"
      + (f", {near} routing near-ties on the other side" if ties is not None else "")
      + f", {bad} failures")
sys.exit(1 if bad else 0)
PY
}

run() {  # OUT ARGS...
  local out=$1; shift
  timeout 300 "$G" --backend=cuda --kv_cache_bytes=268435456 --max_tokens=16 --ignore_eos \
    --dump_last_logits --num_threads=1 "$@" > "$out" 2> "$out.err"
}

prompts_of() { # EXPECTED_JSON
  python3 -c "import json; print(';'.join(','.join(map(str, p)) for p in json.load(open('$1'))['prompts']))"
}

same_tokens() {  # LABEL A B
  python3 - "$@" <<'PY'
import json, sys
label = sys.argv[1]
a, b = ([json.loads(l)["tokens"] for l in open(f) if l.strip()] for f in sys.argv[2:4])
print(f"{label}: {sum(x == y for x, y in zip(a, b))}/{len(a)} prompts with equal tokens")
sys.exit(0 if a == b and a else 1)
PY
}

pass() {  # NAME
  echo "PASS $1"; passed=$((passed + 1))
}

fail() {  # NAME ERR_FILES...
  echo "FAIL $1"; tail -n 3 "${@:2}"; failed=$((failed + 1))
}

tokens_check() {  # NAME LABEL OUT REF ARGS...
  local name=$1 label=$2 out=$3 ref=$4
  shift 4
  if run "$out" "$@" && same_tokens "$label" "$out" "$ref"; then
    pass "$name"
  else
    fail "$name" "$out.err"
  fi
}
