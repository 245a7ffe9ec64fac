#!/usr/bin/env bash
# One device call of a whole-suite GPU run: the tests of a tarred bundle whose paths match
# FILTER, under `timeout SECS`, logs tar'd into $OUT/logs.tgz (tests/gpu/README.md, "Every GPU
# test in three calls").
#
#   OUT=DIR tests/gpu/all_tests_call.sh BUNDLE.tar.xz FILTER SECS
#
# BUNDLE.tar.xz: a tar of one tests/gpu/bundle.sh directory (every cuda_cc_test: the test
# targets of `bazel query 'attr(tags, "\bgpu\b", kind("cc_test", //...))'`), xz'd with a
# dictionary larger than the bundle (xz --lzma2=preset=6,dict=1024MiB -T1: 1.2 GB of 63 binaries,
# mostly the same device code, -> 25 MB; xz -9 alone gives 109 MB). FILTER: run.sh's grep -E
# pattern on the binary paths. Prints the failed binaries, the closing count, and the skipped and
# failed cases.
set -uo pipefail
TARBALL=${1:?bundle .tar.xz} FILTER=${2:?filter} SECS=${3:?seconds}
source "$(dirname "${BASH_SOURCE[0]}")/device_call_lib.sh"
bundle_call_start "$TARBALL" /tmp/all_tests_bundle
device_line
dir=$(dirname "$(find /tmp/all_tests_bundle -maxdepth 2 -name run.sh | head -n 1)")
t0=$SECONDS
timeout "$SECS" "$dir/run.sh" "$LOG/t" "$FILTER" > "$LOG/suite.txt" 2>&1
echo "rc $? in $((SECONDS - t0)) s"
awk '/^=== /{n=$3} /^--- exit/{print n, $3}' "$LOG/suite.txt" > "$LOG/exits.txt"
awk '$2 != 0' "$LOG/exits.txt"
tail -n 1 "$LOG/suite.txt"
grep -h -E "^\[  FAILED|^\[  SKIPPED" "$LOG"/t/*.log | sort -u | head -40
cd "$OUT" && tar czf logs.tgz logs && rm -rf logs
