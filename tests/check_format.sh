#!/usr/bin/env bash
# Checks that every C++/CUDA source of ours is clang-format clean (.clang-format: Google style,
# 100 columns), and that every repository path named in a comment or README exists
# (tests/check_paths.py). With --fix, reformats them in place instead.
#
#   tests/check_format.sh [--fix]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
command -v "$CLANG_FORMAT" >/dev/null || { echo "check_format: $CLANG_FORMAT not found" >&2; exit 1; }

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files --cached --others --exclude-standard \
    '*.h' '*.cc' '*.cu' '*.cuh' | grep -v '^third_party/')
else
  mapfile -t files < <(find . -path ./third_party -prune -o -path './bazel-*' -prune -o \
    \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) -print)
fi
existing=()
for f in "${files[@]}"; do [[ -f $f ]] && existing+=("$f"); done
[[ ${#existing[@]} -gt 0 ]] || { echo "check_format: no sources"; exit 0; }

if [[ ${1:-} == --fix ]]; then
  "$CLANG_FORMAT" -i "${existing[@]}"
  echo "check_format: formatted ${#existing[@]} files"
else
  "$CLANG_FORMAT" --dry-run --Werror "${existing[@]}"
  echo "check_format: ${#existing[@]} files clean"
fi
# Repository paths named in comments and READMEs exist (a git checkout only: it lists files).
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  python3 tests/check_paths.py . || exit 1
  echo "check_paths: clean"
fi
