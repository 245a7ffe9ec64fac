#!/usr/bin/env bash
# Compiles the CUDA sources that issue wgmma (Hopper warpgroup MMA) with the build's own nvcc
# flags (third_party/cuda/cuda.bzl's NVCC_FLAGS, which do not depend on bazel's -c) plus
# -Xptxas -v, prints each kernel's registers / stack / spills, and fails if ptxas reports
# C7519 ("warpgroup.arrive is injected ... to allow use of registers in GMMA": the wgmma
# pipeline serialised, issue 35) or C7508 (setmaxnreg ignored), or any ptxas warning. Not run in
# CI (about a minute of nvcc per file); run it after touching a wgmma kernel.
#
#   tests/check_ptxas.sh [FILE.cu ...]   (default: every .cu / .cuh includer that issues wgmma)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
NVCC=${NVCC:-nvcc}
command -v "$NVCC" >/dev/null || { echo "check_ptxas: $NVCC not found" >&2; exit 1; }
mapfile -t FLAGS < <(python3 - <<'PY'
import ast, re
text = open("third_party/cuda/cuda.bzl").read()
print("\n".join(ast.literal_eval(re.search(r"NVCC_FLAGS = (\[.*?\])", text, re.S).group(1))))
PY
)
[[ ${#FLAGS[@]} -gt 0 ]] || { echo "check_ptxas: no NVCC_FLAGS in cuda.bzl" >&2; exit 1; }
if [[ $# -gt 0 ]]; then
  files=("$@")
else
  mapfile -t files < <(grep -rl --include='*.cu' -e 'wgmma' -e 'prefill_wgmma_kernel.cuh' \
    kernels runtime comm 2>/dev/null | sort)
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
for f in "${files[@]}"; do
  log=$tmp/$(basename "$f").log
  if ! "$NVCC" "${FLAGS[@]}" -I. -Ibazel-bin -Xptxas -v -c "$f" -o "$tmp/out.o" >"$log" 2>&1; then
    echo "FAIL $f: nvcc failed"; tail -5 "$log"; status=1; continue
  fi
  bad=$(grep -E 'C7519|C7508|ptxas warning' "$log")
  spills=$(grep -c -E '[1-9][0-9]* bytes spill stores' "$log")
  kernels=$(grep -c 'Compiling entry function' "$log")
  if [[ -n $bad ]]; then
    echo "FAIL $f"; echo "$bad" | head -5; status=1
  else
    echo "ok   $f: $kernels kernels, $spills with spill stores"
  fi
done
exit $status
