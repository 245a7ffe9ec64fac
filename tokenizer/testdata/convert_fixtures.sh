#!/usr/bin/env bash
# Generates the tokenizer.json fixtures listed in converted.txt from the .model fixtures (which
# fetch_fixtures.sh fetched first) with transformers' own converter (convert_fixtures.py), in a
# venv cached beside the wheels (TANDEM_FIXTURE_CACHE/convert-venv) with the pinned versions
# below, and checks each file's sha256. Idempotent: nothing is installed or run when every file is
# there with its sha256. fetch_fixtures.sh runs it.
#
#   tokenizer/testdata/convert_fixtures.sh
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${TANDEM_FIXTURE_CACHE:-${HOME:-/tmp}/.cache/tandem/tokenizer-fixtures}
# The converter's output depends on these (transformers 4.x: the last with LlamaConverter over
# the slow LlamaTokenizer; it needs tokenizers < 0.23).
PACKAGES=(transformers==4.57.6 tokenizers==0.22.2 sentencepiece==0.2.3 protobuf==7.36.2)
VENV=$CACHE/convert-venv

stale=()
declare -A want
while read -r family source sha; do
  [[ -z $family || $family == \#* ]] && continue
  want[$family]=$sha
  [[ -f $HERE/$source/tokenizer.model ]] \
    || { echo "convert_fixtures: $source/tokenizer.model missing (run fetch_fixtures.sh)" >&2; exit 1; }
  out=$HERE/$family/tokenizer.json
  if [[ -f $out ]] && echo "$sha  $out" | sha256sum -c --status; then continue; fi
  stale+=("$family")
done < "$HERE/converted.txt"
[[ ${#stale[@]} -eq 0 ]] && exit 0

if [[ ! -x $VENV/bin/python || "$(cat "$VENV/.packages" 2>/dev/null)" != "${PACKAGES[*]}" ]]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV" \
    && "$VENV/bin/pip" install --quiet --disable-pip-version-check "${PACKAGES[@]}" \
    || { echo "convert_fixtures: cannot install ${PACKAGES[*]} from PyPI" >&2; exit 1; }
  echo "${PACKAGES[*]}" > "$VENV/.packages"
fi
"$VENV/bin/python" "$HERE/convert_fixtures.py" "$HERE" "${stale[@]}" 2> "$VENV/convert.log" \
  || { cat "$VENV/convert.log" >&2; echo "convert_fixtures: conversion failed" >&2; exit 1; }
for family in "${stale[@]}"; do
  echo "${want[$family]}  $HERE/$family/tokenizer.json" | sha256sum -c --status \
    || { echo "convert_fixtures: $family/tokenizer.json: sha256 differs from converted.txt" >&2; exit 1; }
done
