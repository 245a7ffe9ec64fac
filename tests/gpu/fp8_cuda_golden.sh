#!/usr/bin/env bash
# FP8 weights on the CUDA backend (issue 38) against the CPU backend running the same FP8 model
# (cpu::Fp8Linear, itself checked against transformers by tests/golden:fp8_golden_test), through
# `generate` at the same TP size. The rule (compare_fp8), where the fixture has an expected.json:
#   * CUDA is no farther from transformers' unquantized-activation logits (expected.json; for
#     --quantization=fp8 the f32 model, for a checkpoint its dequantized weights) than the CPU:
#     mean over prompts of (1 - cosine) <= 1.5 x the CPU's + 0.002;
#   * every prompt's CUDA logits within cosine 0.97 of the CPU's (a gross-defect floor);
#   * the first greedy token equal to the CPU's wherever the CPU's top-2 gap is >= 3% of
#     max|logit| AND >= 4 sqrt(2) sigma, sigma the RMS over the vocab of the prompt's CUDA - CPU
#     logit difference: a gap inside 4 standard deviations of the measured FP8 noise may flip
#     (the gap changes by e1 - e2, std sqrt(2) sigma). Why (issue 38, TP=2): both backends
#     quantize each rank's K-slice of o_proj / down_proj inputs per token, as vLLM's
#     RowParallelLinear does (quant_method.apply on input_parallel); the 3% rule alone failed
#     one prompt each of llama / qwen2 / qwen3 at TP=2 where the gap was inside that noise.
#     Each TP=2 prompt also prints the CPU's own TP=1-vs-TP=2 cosine and first tokens: two
#     legitimate draws of the quantization, for scale.
# Why not a tight CUDA-vs-CPU cosine: CUDA quantizes bf16 activations, the CPU fp32 ones, and an
# e4m3 step is 2^-3 relative: the ~2^-9 bf16 difference flips codes near every rounding boundary,
# a second draw of FP8 quantization noise. On the H200 (nvidia-h200-x4, 2026-11-28) CUDA vs CPU
# was 0.985-0.999 per prompt on llama/qwen2/qwen3 --quantization=fp8 (all prompt lengths: GEMV
# and GEMM paths alike) while CUDA's and the CPU's mean 1 - cosine to the f32 model were equal
# (0.0140 / 0.0123, 0.0077 / 0.0080, 0.0101 / 0.0102), and without FP8 the bf16 CUDA run is
# within 0.9998 of the CPU: FP8 amplifies the bf16 rounding; it is not a defect of the FP8 path.
# Without an expected.json (device dummy weights) the per-prompt cosine bound is 0.99.
#   1. The four checkpoint formats of tests/golden/fixtures_fp8 (DeepSeek 128x128 blocks,
#      compressed-tensors per-channel dynamic / per-tensor static, modelopt) and base_bf16 with
#      --quantization=fp8, written again by make_golden_fp8.py --head_dim=64 (the CI fixtures'
#      head_dim 48 has no CUDA attention kernel), and make_golden_fp8_modelopt.py's modelopt
#      variants of them (FP8 KV scales in hf_quant_config.json, FP8_PER_CHANNEL_PER_TOKEN,
#      FP8_PB_WO: TP=1 only, like fp8_block); SKIP when torch / transformers do not import.
#      TP=1 and TP=2 (one GPU per rank where there are two, else --tp_share_device; SHARE
#      overrides), each against the CPU backend at the same TP (fp8_block at TP=1 only: TP=2
#      cuts its 128x128 blocks).
#   2. --quantization=fp8 on the Llama / Qwen2 (qkv bias) / Qwen3 / MQA + bias golden fixtures,
#      TP=1 and TP=2. Prompts longer than 16 tokens run the prefill paths (cuBLASLt FP8 GEMM
#      for per-channel; the chunked-GEMV slow path for 128-column blocks).
#   3. Graph-captured decode against --cuda_graphs=false: greedy tokens identical.
#   4. Device dummy FP8 weights (tiny and tiny-moe, --quantization=fp8; tiny with
#      --quantize_lm_head too) against the CPU's host dummy FP8 weights, TP=1 and TP=2.
#   Parts 1 and 2 also run base_bf16 (expected_lm_head.json) and llama_f32_gqa with
#   --quantization=fp8 --quantize_lm_head, and ct_channel_dynamic / fp8_block with
#   --quantize_lm_head (expected_lm_head.json).
#   5. An fp16 model with --quantization=fp8 refused, naming bf16.
#   6. The FP8 MoE / MLA checkpoints (ct_moe_channel_dynamic[_pkg], fp8_deepseek_v3), TP=1 / 2 / EP
#      (a) / EP (b) (--dp_attention; against the CPU backend's --dp_attention run, and its eager
#      padded steps against the graphs' tokens: NAME-dp, NAME-dp-eager).
#      ct_moe_block_dynamic (compressed-tensors FP8_BLOCK) at TP=1.
#   7. pd: prefill -> decode between CUDA workers through the router (moe_pd_cuda_golden.sh's
#      chains; P and D may share one GPU): fp8_deepseek_v3 (its decode worker also drafting with
#      the checkpoint's FP8 MTP layer, P handing its MTP state over; a mixed worker drafting
#      with it gives its greedy tokens without), ct_moe_channel_dynamic,
#      llama_f32_gqa with --quantization=fp8 and the head_dim-64 formats where part 1 wrote them in
#      LOG: tokens over P -> D equal to the mixed worker's, KV received, no recompute (NCCL rows
#      with 2 GPUs); a bf16 prefill and an FP8 decode worker do not pair. The same chains on the
#      CPU backend (pd-cpu), and the CUDA mixed workers' tokens against the CPU's (pd-vs-cpu):
#      the first token equal wherever the reference's top-2 gap is >= 3% of max|logit| (15%
#      where the fixture has no activation-quantizing reference: the workers return no logits for
#      part 1's noise rule), whole sequences printed.
#
#   [ONLY=REGEX] tests/gpu/fp8_cuda_golden.sh BUNDLE_DIR LOG_DIR
#
# ONLY (an extended regex): just the checks whose names match (a device call runs disjoint
# subsets side by side, one GPU each with SHARE=--tp_share_device). Each check's CPU run goes
# in the background while its CUDA run executes.
#
# BUNDLE_DIR: tests/gpu/bundle.sh with tool//runtime:generate (pd: tool//runtime:tandem_worker
# tool//router:tandem_router tool//router:tandem_cli). Run from the repository root.
# Prints "N passed, N failed, N skipped".
set -uo pipefail
# Rank r on GPU r where there are two GPUs; on one GPU the ranks share it (--tp_share_device),
# as cuda_golden_lib.sh does by default (a TP=2 run asking for device 1 of one failed every
# TP=2 check with "invalid device ordinal").
if [[ -z ${SHARE+set} ]]; then
  if (( $(nvidia-smi -L 2> /dev/null | grep -c '^GPU') >= 2 )); then SHARE=""; else SHARE=--tp_share_device; fi
fi
export SHARE
source "$(dirname "${BASH_SOURCE[0]}")/cuda_golden_lib.sh"

run_cpu() { # OUT ARGS...
  local out=$1
  shift
  timeout 300 "$G" --backend=cpu --max_tokens=16 --ignore_eos --dump_last_logits \
    --num_threads=2 "$@" > "$out" 2> "$out.err"
}

compare_fp8() { # NAME OUT CPU_OUT EXPECTED_JSON|"" [CPU_OTHER_TP_OUT]
  python3 - "$@" << 'PY'
import json, math, os, sys
name, out, ref = sys.argv[1:4]
exp = json.load(open(sys.argv[4]))["last_prompt_logits"] if len(sys.argv) > 4 and sys.argv[4] else None
other_path = sys.argv[5] if len(sys.argv) > 5 else ""
load = lambda p: [json.loads(l) for l in open(p) if l.strip()]
got, want = load(out), load(ref)
other = load(other_path) if other_path and os.path.exists(other_path) else None
assert len(got) == len(want) > 0
def cos(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
def rms_diff(a, b):
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)) / len(a))
floor = 0.97 if exp is not None else 0.99
bad, worst, same, d_cuda, d_cpu = 0, 1.0, 0, 0.0, 0.0
for i, (g, w) in enumerate(zip(got, want)):
    lg, lw = g["last_prompt_logits"], w["last_prompt_logits"]
    c = cos(lg, lw); worst = min(worst, c)
    if c < floor: print(f"{name} prompt {i}: cosine to the CPU {c:.5f} < {floor}"); bad += 1
    if exp is not None:
        d_cuda += (1 - cos(lg, exp[i])) / len(got); d_cpu += (1 - cos(lw, exp[i])) / len(got)
    top = sorted(lw, reverse=True)
    gap, sigma = top[0] - top[1], rms_diff(lg, lw)
    needed = max(0.03 * max(abs(x) for x in lw), 4 * math.sqrt(2) * sigma)
    note = ""
    if other is not None:
        lo = other[i]["last_prompt_logits"]
        note = (f"; CPU other TP: cosine {cos(lw, lo):.5f}, first token "
                f"{other[i]['tokens'][0]} vs {w['tokens'][0]}, rms diff {rms_diff(lw, lo):.4f}")
    if g["tokens"][0] != w["tokens"][0]:
        verdict = "FAIL" if gap >= needed else "inside the noise"
        print(f"{name} prompt {i}: first token {g['tokens'][0]} != {w['tokens'][0]}, CPU top-2 gap "
              f"{gap:.4f} (3% of max|logit| {0.03 * max(abs(x) for x in lw):.4f}, 4 sqrt(2) sigma "
              f"{4 * math.sqrt(2) * sigma:.4f}, cosine {c:.5f}): {verdict}{note}")
        bad += gap >= needed
    elif note:
        print(f"{name} prompt {i}: cosine to the CPU {c:.5f}, sigma {sigma:.4f}{note}")
    same += g["tokens"] == w["tokens"]
if exp is not None and d_cuda > 1.5 * d_cpu + 0.002:
    print(f"{name}: mean 1 - cosine to transformers {d_cuda:.5f} > 1.5 x the CPU's {d_cpu:.5f} "
          f"+ 0.002"); bad += 1
print(f"{name}: {len(got)} prompts, cosine to the CPU >= {worst:.6f}"
      + (f", mean 1 - cosine to transformers CUDA {d_cuda:.5f} CPU {d_cpu:.5f}" if exp else "")
      + f", greedy tokens equal on {same}/{len(got)}, {bad} failures")
sys.exit(1 if bad else 0)
PY
}

want() { # NAME...: true when ONLY is unset or matches one of the names
  local n
  for n in "$@"; do
    [[ -z ${ONLY:-} || $n =~ $ONLY ]] && return 0
  done
  return 1
}

check() { # NAME TPS EXPECTED_JSON|"" ARGS... : CUDA at TP=t against the CPU backend at TP=t,
  # t in TPS ("1 2") (row-parallel layers quantize each rank's slice of a token: TP=2 differs
  # from TP=1 itself)
  local name=$1 tps=$2 exp=$3 ok=1
  shift 3
  want "$name" || return 0
  for t in $tps; do
    local share=() cpu rc
    [[ $t == 2 ]] && share=($SHARE)
    run_cpu "$LOG/$name.cpu$t.jsonl" "$@" --tp="$t" &
    cpu=$!
    run "$LOG/$name.$t.jsonl" "$@" --tp="$t" "${share[@]}"
    rc=$?
    wait "$cpu" && [[ $rc == 0 ]] &&
      compare_fp8 "$name-tp$t" "$LOG/$name.$t.jsonl" "$LOG/$name.cpu$t.jsonl" "$exp" \
        "$([[ $t == 2 ]] && echo "$LOG/$name.cpu1.jsonl")" || ok=0
  done
  if [[ $ok == 1 ]]; then
    pass "$name"
  else
    fail "$name" "$LOG/$name".*.err
  fi
}

# 1. The checkpoint formats, head_dim 64.
FIX64=$LOG/fixtures_fp8_hd64
FORMATS="fp8_block ct_channel_dynamic ct_tensor_static modelopt base_bf16 modelopt_kv_hf
  modelopt_channel modelopt_pb_wo"
# shellcheck disable=SC2086 # the names, split
if ! want $FORMATS base_bf16_lm_head ct_channel_dynamic_lm_head fp8_block_lm_head; then
  :
elif python3 -c "import torch, transformers, safetensors" 2> /dev/null &&
  python3 tests/golden/make_golden_fp8.py --out "$FIX64" --head_dim=64 > "$LOG/make_golden_fp8.log" 2>&1 &&
  python3 tests/golden/make_golden_fp8_modelopt.py --fixtures "$FIX64/fp8" >> "$LOG/make_golden_fp8.log" 2>&1; then
  for fmt in $FORMATS; do
    fix=$FIX64/fp8/$fmt
    extra=()
    [[ $fmt == base_bf16 ]] && extra=(--quantization=fp8)
    # fp8_block: TP=2 would cut its 128x128 scale blocks (k/v rows 64 a rank): refused, TP=1 only.
    tps="1 2"
    [[ $fmt == fp8_block || $fmt == modelopt_pb_wo ]] && tps=1
    check "$fmt" "$tps" "$fix/expected.json" --model="$fix" \
      --prompt_ids="$(prompts_of "$fix/expected.json")" "${extra[@]}"
  done
  # lm_head FP8 too (--quantize_lm_head): transformers with the head per-channel as well, on
  # the bf16 model (--quantization=fp8) and on two checkpoint formats.
  fix=$FIX64/fp8/base_bf16
  check base_bf16_lm_head "1 2" "$fix/expected_lm_head.json" --model="$fix" \
    --prompt_ids="$(prompts_of "$fix/expected.json")" --quantization=fp8 --quantize_lm_head
  for fmt in ct_channel_dynamic fp8_block; do
    fix=$FIX64/fp8/$fmt
    tps="1 2"
    [[ $fmt == fp8_block ]] && tps=1
    check "${fmt}_lm_head" "$tps" "$fix/expected_lm_head.json" --model="$fix" \
      --prompt_ids="$(prompts_of "$fix/expected.json")" --quantize_lm_head
  done
else
  echo "SKIP checkpoint formats: torch / transformers / safetensors missing or make_golden_fp8.py failed"
  tail -n 3 "$LOG/make_golden_fp8.log" 2> /dev/null
  skipped=$((skipped + 1))
fi

# 2. Online FP8 on the bf16 golden fixtures (per-channel weights, per-token activations).
for variant in llama_f32_gqa qwen2_f32 qwen3_f32 llama_f32_mqa_headdim_bias; do
  fix=tests/golden/fixtures/$variant
  check "$variant-fp8" "1 2" "$fix/expected.json" --model="$fix" \
    --prompt_ids="$(prompts_of "$fix/expected.json")" --quantization=fp8
done
fix=tests/golden/fixtures/llama_f32_gqa  # lm_head FP8 too (against the f32 model)
check llama_f32_gqa-fp8-lm_head "1 2" "$fix/expected.json" --model="$fix" \
  --prompt_ids="$(prompts_of "$fix/expected.json")" --quantization=fp8 --quantize_lm_head

# 3. Graphs against eager decode on the same FP8 model.
fix=tests/golden/fixtures/llama_f32_gqa
want fp8-graphs-vs-eager && tokens_check fp8-graphs-vs-eager "eager vs graphs" "$LOG/eager.jsonl" \
  "$LOG/llama_f32_gqa-fp8.1.jsonl" --model="$fix" --prompt_ids="$(prompts_of "$fix/expected.json")" \
  --quantization=fp8 --cuda_graphs=false

# 4. Device dummy FP8 weights against the CPU's host dummy FP8 weights (same draw, same codes).
check tiny-dummy-fp8 "1 2" "" --load_format=dummy --dummy_config=tiny --dummy_seed=3 --quantization=fp8 \
  --prompt_ids="5,6,7,8,9;100,200,30;17;$(seq -s, 3 42)"
check tiny-dummy-fp8-lm_head "1 2" "" --load_format=dummy --dummy_config=tiny --dummy_seed=3 \
  --quantization=fp8 --quantize_lm_head --prompt_ids="5,6,7,8,9;100,200,30;17;$(seq -s, 3 42)"
# The same for a MoE model: device dummy FP8 experts (cuda_moe_fp8.h FillFp8MoeDummy) against the
# CPU's host-quantized dummy experts, TP=1 and TP=2 (each rank its slice of every expert).
check tiny-moe-dummy-fp8 "1 2" "" --load_format=dummy --dummy_config=tiny-moe --dummy_seed=3 \
  --quantization=fp8 --prompt_ids="5,6,7,8,9;100,200,30;17;$(seq -s, 3 42)"

# 6. FP8 MoE / MLA checkpoints (issues 38 / 32: runtime/cuda/cuda_moe_fp8.h,
# cuda_mla_model_fp8.cc): the compressed-tensors Qwen3-MoE fixtures (per-channel experts,
# per-token activations; our writer and the real package) at TP=1, TP=2 (experts' rows split)
# and TP=2 EP (a); DeepSeek-V3 (128 x 128 blocks, 1 x 128 activations: MLA projections, dense
# MLP, routed and shared experts) at TP=1 and TP=2 EP (a) (plain TP=2 cuts its 128-blocks).
for fix in ct_moe_channel_dynamic ct_moe_channel_dynamic_pkg fp8_deepseek_v3; do
  dir=tests/golden/fixtures_fp8/$fix
  tps="1 2"
  [[ $fix == fp8_deepseek_v3 ]] && tps=1
  check "$fix" "$tps" "$dir/expected.json" --model="$dir" --prompt_ids="$(prompts_of "$dir/expected.json")"
  check "$fix-ep" 2 "$dir/expected.json" --model="$dir" --prompt_ids="$(prompts_of "$dir/expected.json")" \
    --enable_expert_parallel
  # EP (b): --dp_attention, each rank its own requests, its FP8 experts on the rows dispatched to
  # it (decode steps padded alike on both ranks, as CUDA graphs); then the same steps eager.
  check "$fix-dp" 2 "$dir/expected.json" --model="$dir" --prompt_ids="$(prompts_of "$dir/expected.json")" \
    --enable_expert_parallel --dp_attention
  # shellcheck disable=SC2086 # SHARE: flags, split
  want "$fix-dp-eager" && tokens_check "$fix-dp-eager" "EP (b) eager vs graphs" "$LOG/$fix.dp-eager.jsonl" \
    "$LOG/$fix-dp.2.jsonl" --model="$dir" --prompt_ids="$(prompts_of "$dir/expected.json")" --tp=2 \
    --enable_expert_parallel --dp_attention --cuda_graphs=false $SHARE
done
# The compressed-tensors FP8_BLOCK MoE fixture (128 x 128 blocks, 1 x 128 activations, partial edge
# blocks) at TP=1: TP=2 and EP (a) cut its blocks (refused). Added without a GPU: not yet run.
CT_BLOCK=tests/golden/fixtures_fp8/ct_moe_block_dynamic
check ct_moe_block_dynamic 1 "$CT_BLOCK/expected.json" --model="$CT_BLOCK" \
  --prompt_ids="$(prompts_of "$CT_BLOCK/expected.json")"

# 7. P -> D between CUDA workers, and the same on the CPU backend.
pd_vs_cpu() { # CHAIN=MODEL_DIR...: the mixed workers' tokens of $LOG/pd/CHAIN against pd-cpu's
  python3 - "$LOG" "$@" << 'PY'
import json, sys
log, bad = sys.argv[1], 0
for arg in sys.argv[2:]:
    chain, model = arg.split("=", 1)
    a, b = (json.load(open(f"{log}/{d}/{chain}/mixed.json")) for d in ("pd", "pd-cpu"))
    exp = json.load(open(f"{model}/expected.json"))
    aq = "_act_quant" if "last_prompt_logits_act_quant" in exp else ""
    gap_min = 0.03 if aq else 0.15  # the unquantized reference: moe_pd_cuda_golden.sh's judge
    for i, (x, y) in enumerate(zip(a, b)):
        lg = exp["last_prompt_logits" + aq][i]
        top = sorted(lg, reverse=True)
        if x[:1] != y[:1] and top[0] - top[1] >= gap_min * max(abs(v) for v in lg):
            print(f"{chain} prompt {i}: first token {x[:1]} != the CPU's {y[:1]}"); bad += 1
    print(f"{chain}: CUDA vs CPU mixed workers, first tokens equal on "
          f"{sum(x[:1] == y[:1] for x, y in zip(a, b))}/{len(a)}, whole sequences on "
          f"{sum(x == y for x, y in zip(a, b))}/{len(a)}")
    bad += len(a) == 0
sys.exit(1 if bad else 0)
PY
}
if want pd; then
  pd=(ct_moe_channel_dynamic tests/golden/fixtures/llama_f32_gqa:fp8)
  chains=(mla/fp8_deepseek_v3=tests/golden/fixtures_fp8/fp8_deepseek_v3
    dense/ct_moe_channel_dynamic=tests/golden/fixtures_fp8/ct_moe_channel_dynamic
    dense/llama_f32_gqa-fp8=tests/golden/fixtures/llama_f32_gqa)
  for fmt in $FORMATS; do
    [[ -d $FIX64/fp8/$fmt ]] || continue
    sfx=$([[ $fmt == base_bf16 ]] && echo :fp8)
    pd+=("$FIX64/fp8/$fmt$sfx") chains+=("dense/$fmt${sfx:+-fp8}=$FIX64/fp8/$fmt")
  done
  pids=() runs=()
  for sub in pd pd-cpu; do
    for part in mla dense; do
      fixtures=fp8_deepseek_v3 rows="ucx nccl spec_ucx spec_mixed"
      [[ $part == dense ]] && fixtures="${pd[*]}" rows="ucx nccl mismatch"
      env BACKEND="$([[ $sub == pd ]] && echo cuda || echo cpu)" PARALLEL=1 TOKENS_VS_HF=first \
        FIXTURES="$fixtures" ROWS="$rows" tests/gpu/moe_pd_cuda_golden.sh "$B" "$LOG/$sub/$part" \
        > "$LOG/$sub.$part.txt" 2>&1 &
      pids+=($!) runs+=("$sub.$part")
    done
  done
  for i in "${!pids[@]}"; do
    if wait "${pids[$i]}"; then pass "${runs[$i]}"; else fail "${runs[$i]}" "$LOG/${runs[$i]}.txt"; fi
  done
  if pd_vs_cpu "${chains[@]}"; then pass pd-vs-cpu; else fail pd-vs-cpu; fi
fi

# 5. fp16 activations with FP8 weights: refused by name.
if ! want fp16-refused; then
  :
elif ! run "$LOG/f16.jsonl" --model=tests/golden/fixtures/qwen2_f16 --prompt_ids=5,6 \
  --quantization=fp8 && grep -q "bf16 activations only" "$LOG/f16.jsonl.err"; then
  pass "fp16-refused"
else
  fail "fp16-refused" "$LOG/f16.jsonl.err"
fi
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed == 0 ]]
