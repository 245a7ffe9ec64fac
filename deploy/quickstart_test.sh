#!/usr/bin/env bash
# deploy/quickstart.sh builds what its demo runs and nothing else (issue 30 item 11: it built all
# 373 targets, every CUDA kernel and every test, 18 minutes on a fresh 2-core machine, for a CPU
# demo of four binaries):
#   * its build line builds "${DEMO_TARGETS[@]}" with --config=cpu (no CUDA kernel), never //...;
#   * every binary it or up.sh runs from the bin dir ($BIN/PKG/NAME, $bin_dir/PKG/NAME) is in
#     DEMO_TARGETS (or built on the same line), and every DEMO_TARGETS entry is run;
#   * every DEMO_TARGETS label is a binary Bazel built (the test's data, passed as arguments).
#
#   quickstart_test.sh QUICKSTART_SH UP_SH BUILT_BINARY...
set -euo pipefail
QUICKSTART=$1 UP=$2
shift 2
built=("$@")
fail() { echo "FAIL: $*" >&2; exit 1; }

mapfile -t targets < <(sed -n '/^DEMO_TARGETS=(/,/)/p' "$QUICKSTART" | grep -o '//[^ )"]*')
(( ${#targets[@]} > 0 )) || fail "no DEMO_TARGETS=(...) in $QUICKSTART"
build=$(grep -E '^[^#]*\bbazel build\b' "$QUICKSTART" | grep -v '^ *generate=' || true)
[[ -n $build ]] || fail "no bazel build line"
[[ $build != *'//...'* ]] || fail "the quickstart builds every target: $build"
[[ $build == *'"${DEMO_TARGETS[@]}"'* ]] || fail "the build line does not build DEMO_TARGETS: $build"
grep -qE '^BAZEL_FLAGS=\(.*--config=cpu' "$QUICKSTART" || fail "no --config=cpu in BAZEL_FLAGS"
[[ $build == *'"${BAZEL_FLAGS[@]}"'* ]] || fail "the build line does not use BAZEL_FLAGS: $build"

label() { echo "//$(dirname "$1"):$(basename "$1")"; }  # runtime/model/x -> //runtime/model:x
listed() { local t; for t in "${targets[@]}"; do [[ $t == "$1" ]] && return 0; done; return 1; }
used=()
while IFS= read -r line; do
  for path in $(grep -oE '\$(BIN|bin_dir)/[A-Za-z0-9_/]+' <<<"$line" | sed 's|^\$[a-z_A-Z]*/||'); do
    l=$(label "$path")
    used+=("$l")
    listed "$l" || [[ $line == *"bazel build"*"$l"* ]] || fail "runs $path, which it does not build: $line"
  done
done < <(grep -hv '^ *#' "$QUICKSTART" "$UP")
for t in "${targets[@]}"; do
  found=0
  for u in "${used[@]}"; do [[ $u == "$t" ]] && found=1; done
  (( found )) || fail "builds $t, which the demo never runs"
  found=0
  for b in "${built[@]}"; do [[ $(label "$b") == "$t" ]] && found=1; done
  (( found )) || fail "$t is not a binary Bazel built (not among: ${built[*]})"
done
echo "PASS: the quickstart builds ${targets[*]} (--config=cpu), exactly what it and up.sh run"
