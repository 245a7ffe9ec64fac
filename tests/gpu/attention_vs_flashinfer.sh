#!/usr/bin/env bash
# Tandem's attention kernels against FlashInfer (the kernels vLLM and SGLang run on Hopper) in
# one device call, on the same shapes (Llama-3-8B attention: 32 q / 8 kv heads, d128, bf16, page
# 16, shuffled pages), and the ratio table: FlashInfer's best variant's time / ours per shape
# (> 1: ours faster). Runs on the GPU machine.
#
#   tests/gpu/attention_vs_flashinfer.sh BUNDLE FLASHINFER_DIR OUT [BASELINE_BUNDLE]
#
# BUNDLE: a tests/gpu/bundle.sh output holding //kernels/attention/cuda:attention_cuda_bench and
# //kernels/attention/cuda:prefill_attention_cuda_bench. FLASHINFER_DIR: the peer package
# (../shared/peers/flashinfer, copied into a git-ignored folder of the checkout and carried);
# its run_flashinfer.sh runs unchanged (FI_SKIP=tc-fa3,fa3 drops variants). BASELINE_BUNDLE
# (optional): a second bundle (e.g. of the previous commit) measured in the same call, whose
# ratios are printed beside BUNDLE's. Decode times are taken as FlashInfer takes them
# (attention_cuda_bench --flush_l2: one call between events after a 256 MiB L2 flush, median);
# prefill times are back-to-back means (0.3-4 ms calls, where the flush does not matter).
# Writes OUT/{ours,baseline}_{decode,prefill}.txt, OUT/flashinfer.txt(.json, .log) and
# OUT/ratio.txt (also printed). Exits non-zero if a step fails.
#
# Optional environment, for a short call (defaults: the full run above):
#   DECODE_ARGS             extra attention_cuda_bench arguments for both builds (e.g.
#                           "--pool_gib=8 --only=bf16:1x4096,bf16:16x4096")
#   BASELINE_DECODE_ARGS    extra arguments for the baseline only: BASELINE_BUNDLE may be BUNDLE
#                           itself with "--legacy_split_merge" (the old planner and merge)
#   SKIP_PREFILL=1          no prefill benchmarks, ours or FlashInfer's
#   FI_DECODE_SHAPES        FlashInfer decode shapes, e.g. "1x4096,16x1024" (default: all of the
#                           peer's); set, or with SKIP_PREFILL, the peer runs through a wrapper
#                           that overrides its shape lists and skips its spot checks
set -uo pipefail

usage() { echo "usage: $0 BUNDLE FLASHINFER_DIR OUT [BASELINE_BUNDLE]" >&2; exit 2; }
[[ $# -ge 3 && $# -le 4 ]] || usage
BUNDLE=$(cd "$1" && pwd) || usage
FI_DIR=$(cd "$2" && pwd) || usage
mkdir -p "$3" && OUT=$(cd "$3" && pwd)
BASE=""
if [[ $# -eq 4 ]]; then BASE=$(cd "$4" && pwd) || usage; fi
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export NCCL_NVLS_ENABLE=0
status=0

run_ours() {  # BUNDLE_DIR PREFIX EXTRA_DECODE_ARGS
  local bin=$1/bin/kernels/attention/cuda
  local libs="$1/lib:${CUDA_HOME:-/usr/local/cuda}/lib64:/usr/local/cuda/lib64"
  echo "[attention_vs_flashinfer] $2: $1 ${DECODE_ARGS:-} $3"
  # shellcheck disable=SC2086  # the extra arguments are word lists
  LD_LIBRARY_PATH="$libs:${LD_LIBRARY_PATH:-}" "$bin/attention_cuda_bench" --flush_l2 \
    ${DECODE_ARGS:-} $3 > "$OUT/$2_decode.txt" 2>&1 || { echo "$2 decode bench failed"; status=1; }
  [[ "${SKIP_PREFILL:-0}" == 1 ]] && return
  LD_LIBRARY_PATH="$libs:${LD_LIBRARY_PATH:-}" "$bin/prefill_attention_cuda_bench" \
    > "$OUT/$2_prefill.txt" 2>&1 || { echo "$2 prefill bench failed"; status=1; }
}

# The peer with its shape lists overridden (FI_DECODE_SHAPES, SKIP_PREFILL): a copy of the peer
# folder whose peers_flashinfer.py loads the original as a module, edits it and runs main().
subset_peer() {
  local dir=${TMPDIR:-/tmp}/fi_subset
  mkdir -p "$dir"
  for f in "$FI_DIR"/*; do
    [[ $(basename "$f") == peers_flashinfer.py ]] || ln -sfn "$f" "$dir/"
  done
  cat > "$dir/peers_flashinfer.py" <<PY
import importlib.util, os
spec = importlib.util.spec_from_file_location("peers", "$FI_DIR/peers_flashinfer.py")
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
shapes = os.environ.get("FI_DECODE_SHAPES", "")
if shapes:
    m.DECODE_SHAPES = [tuple(int(x) for x in s.split("x")) for s in shapes.split(",")]
if os.environ.get("SKIP_PREFILL") == "1":
    m.PREFILL_SHAPES = []
m.spot_checks = lambda lines: lines.append("spot checks skipped (subset run)")
m.main()
PY
  echo "$dir"
}

t0=$(date +%s)
run_ours "$BUNDLE" ours ""
if [[ -n "$BASE" ]]; then run_ours "$BASE" baseline "${BASELINE_DECODE_ARGS:-}"; fi
echo "[attention_vs_flashinfer] ours done in $(( $(date +%s) - t0 ))s; FlashInfer next"
PEER=$FI_DIR
if [[ -n "${FI_DECODE_SHAPES:-}" || "${SKIP_PREFILL:-0}" == 1 ]]; then PEER=$(subset_peer); fi
export FI_DECODE_SHAPES SKIP_PREFILL
bash "$PEER/run_flashinfer.sh" "$OUT/flashinfer.txt" > /dev/null 2>&1 || {
  echo "run_flashinfer.sh failed: see $OUT/flashinfer.txt.log"; status=1; }
echo "[attention_vs_flashinfer] FlashInfer done at $(( $(date +%s) - t0 ))s"
python3 "$HERE/attention_vs_flashinfer.py" "$OUT" | tee "$OUT/ratio.txt" || status=1
exit $status
