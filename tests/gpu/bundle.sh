#!/usr/bin/env bash
# Builds GPU tests and benchmarks and stages them, self-contained, into OUT_DIR.
#
#   tests/gpu/bundle.sh OUT_DIR [--with-cuda-libs] [//pkg:target ...] [tool//pkg:target ...]
#
# A target written tool//pkg:target (e.g. the worker and router binaries for a GPU serving
# smoke test) is staged into bin/ with its libraries but not run by run.sh.
# Default targets: every cc_test tagged "gpu" and cc_binary tagged "gpu_bench" (the
# cuda_cc_test / cuda_cc_binary macros add the tags). The result runs on a machine with only
# the NVIDIA driver and the CUDA 13 runtime libraries: no Bazel, Java or Debian packages.
#
# OUT_DIR layout:
#   bin/<package>/<name>   the binaries (our code and gtest linked statically, cudart static)
#   lib/                   every shared library they need that is not part of glibc or the
#                          NVIDIA driver (Abseil, glog, gRPC, libstdc++, ...), found with ldd
#   manifest.txt           "test|bench <bin path>" lines, in run order
#   run.sh                 OUT_DIR/run.sh LOG_DIR [FILTER]: runs them, writes logs + JUnit XML
#
# CUDA toolkit libraries (cuBLAS, NCCL: hundreds of MiB) are taken from the target machine's
# CUDA 13 installation ($CUDA_HOME/lib64, /usr/local/cuda/lib64) unless --with-cuda-libs copies
# them too.
set -euo pipefail

usage() { echo "usage: $0 OUT_DIR [--with-cuda-libs] [//pkg:target ...]" >&2; exit 2; }
[[ $# -ge 1 ]] || usage
OUT=$1; shift
WITH_CUDA_LIBS=0
TARGETS=()
TOOLS=()
for a in "$@"; do
  case "$a" in
    --with-cuda-libs) WITH_CUDA_LIBS=1 ;;
    //*) TARGETS+=("$a") ;;
    tool//*) TOOLS+=("${a#tool}") ;;
    *) usage ;;
  esac
done

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
BAZEL=${BAZEL:-bazel}

if [[ ${#TARGETS[@]} -eq 0 ]]; then
  mapfile -t TARGETS < <($BAZEL query --noshow_progress \
    'attr(tags, "\bgpu(_bench)?\b", kind("cc_test|cc_binary", //...))' 2>/dev/null | sort)
fi
if [[ ${#TARGETS[@]} -eq 0 ]]; then
  echo "bundle.sh: no GPU targets found. Is this a CPU-only build (no CUDA toolkit, or" \
       "--config=cpu)?" >&2
  exit 1
fi

echo "bundle.sh: building ${#TARGETS[@]} targets and ${#TOOLS[@]} tools" >&2
$BAZEL build --noshow_progress "${TARGETS[@]}" ${TOOLS[@]+"${TOOLS[@]}"} >&2
BIN_DIR=$($BAZEL info bazel-bin 2>/dev/null)

mkdir -p "$OUT/bin" "$OUT/lib"
: > "$OUT/manifest.txt"

# Libraries the target machine provides itself: glibc and the dynamic loader, and the NVIDIA
# driver. Everything else a binary needs travels in lib/.
is_system_lib() {
  case "$(basename "$1")" in
    linux-vdso*|ld-linux*|libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libresolv.so*|\
    libutil.so*|libcuda.so*|libnvidia-*) return 0 ;;
  esac
  return 1
}
is_cuda_toolkit_lib() {
  case "$1" in
    */cuda*/lib64/*|*/cuda*/targets/*) return 0 ;;
  esac
  return 1
}

for t in "${TARGETS[@]}" ${TOOLS[@]+"${TOOLS[@]}"}; do
  pkg=${t#//}; pkg=${pkg%%:*}; name=${t##*:}
  if [[ " ${TOOLS[*]-} " == *" $t "* ]]; then
    kind=tool
  else
    kind=$($BAZEL query --noshow_progress "kind(cc_test, $t)" 2>/dev/null | grep -q . && echo test || echo bench)
  fi
  src="$BIN_DIR/$pkg/$name"
  [[ -x "$src" ]] || { echo "bundle.sh: $src missing after build" >&2; exit 1; }
  mkdir -p "$OUT/bin/$pkg"
  install -m 0755 "$src" "$OUT/bin/$pkg/$name"
  echo "$kind bin/$pkg/$name" >> "$OUT/manifest.txt"
  while read -r lib; do
    [[ -n "$lib" ]] || continue
    is_system_lib "$lib" && continue
    if is_cuda_toolkit_lib "$lib" && [[ $WITH_CUDA_LIBS -eq 0 ]]; then continue; fi
    cp -Lf "$lib" "$OUT/lib/$(basename "$lib")"
  done < <(ldd "$src" | awk '/=> \// {print $3} /^\s*\// {print $1}'
           # SentencePiece (tokenizer/sentencepiece_library.h): dlmopen'ed, so not in ldd's list;
           # found at run time through LD_LIBRARY_PATH.
           spm="$src.runfiles/tandem/tokenizer/libtandem_spm.so"
           if [[ -f $spm ]]; then echo "$spm"; ldd "$spm" | awk '/=> \// {print $3}'; fi)
done

# Tests first, then benchmarks.
sort -s -k1,1r -o "$OUT/manifest.txt" "$OUT/manifest.txt"
install -m 0755 "$ROOT/tests/gpu/run.sh" "$OUT/run.sh"
echo "bundle.sh: staged $(wc -l < "$OUT/manifest.txt") binaries and $(ls "$OUT/lib" | wc -l)" \
     "libraries ($(du -sh "$OUT" | cut -f1)) in $OUT" >&2
