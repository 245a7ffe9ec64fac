#!/usr/bin/env bash
# tests/check_paths.py finds a comment naming a missing repository path, and accepts existing
# ones (from the root, or relative to a README's folder).
set -uo pipefail
CHECK=$1
T=${TEST_TMPDIR:-$(mktemp -d)}/repo
rm -rf "$T"; mkdir -p "$T/proto/tandem/v1" "$T/runtime/worker"
cd "$T" && git init -q .
echo '// limits in proto/tandem/v1/limits.h' >runtime/worker/a.cc
touch proto/tandem/v1/limits.h
echo 'See `worker/a.cc` and `runtime/worker/a.cc:1`.' >runtime/README.md
git add -A
python3 "$OLDPWD/$CHECK" "$T" || { echo "FAIL: existing paths refused"; exit 1; }
echo '// stale: see proto/limits.h' >>runtime/worker/a.cc
echo 'int x = 0;  // not a comment path: "runtime/tandem_worker"' >>runtime/worker/a.cc
git add -A
out=$(python3 "$OLDPWD/$CHECK" "$T") && { echo "FAIL: missing path accepted"; exit 1; }
grep -q 'runtime/worker/a.cc:2: proto/limits.h' <<<"$out" || { echo "FAIL: $out"; exit 1; }
[[ $(wc -l <<<"$out") -eq 1 ]] || { echo "FAIL: extra reports: $out"; exit 1; }
echo PASS
