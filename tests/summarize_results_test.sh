#!/usr/bin/env bash
# Checks tests/summarize_results.py's counting on crafted Bazel build events + gtest XML:
# passed/failed/skipped cases, a crashed target without a report, an expected target that
# never ran, extra checks, and the exit code.
set -euo pipefail
SUMMARIZE=$1
T=${TEST_TMPDIR:-$(mktemp -d)}

cat > "$T/a.xml" <<'XML'
<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="4" failures="1">
  <testsuite name="A" tests="4">
    <testcase name="ok1" status="run" result="completed" />
    <testcase name="ok2" status="run" result="completed" />
    <testcase name="bad" status="run" result="completed">
      <failure message="x" type=""><![CDATA[boom]]></failure>
    </testcase>
    <testcase name="gpu" status="run" result="skipped"><skipped message="no GPU"/></testcase>
  </testsuite>
</testsuites>
XML
cat > "$T/b.xml" <<'XML'
<?xml version="1.0" encoding="UTF-8"?>
<testsuites><testsuite name="B">
  <testcase name="s1" status="run" result="skipped" />
  <testcase name="s2" status="notrun" result="suppressed" />
  <testcase name="p" status="run" result="completed" />
</testsuite></testsuites>
XML
ev() {  # label status [xml]
  local out=""
  [[ -n ${3:-} ]] && out=",\"testActionOutput\":[{\"name\":\"test.xml\",\"uri\":\"file://$3\"}]"
  echo "{\"id\":{\"testResult\":{\"label\":\"$1\",\"run\":1}},\"testResult\":{\"status\":\"$2\"$out}}"
}
{
  echo '{"id":{"started":{}},"started":{}}'
  ev //a:a_test FAILED "$T/a.xml"
  ev //b:b_test PASSED "$T/b.xml"
  ev //c:crash_test FAILED
  ev //d:plain_test PASSED
} > "$T/bep.json"
printf '//a:a_test\n//b:b_test\n//c:crash_test\n//d:plain_test\n//e:never_built_test\n' > "$T/expected"

set +e
out=$(python3 "$SUMMARIZE" "$T/bep.json" "$T/expected" "fmt=passed" "build=failed")
rc=$?
set -e
echo "$out"
last=$(echo "$out" | tail -n 1)
# passed: a 2 + b 1 + plain 1 + fmt 1 = 5; failed: a 1 + crash 1 + never_built 1 + build 1 = 4;
# skipped: a 1 + b 2 = 3.
[[ $last == "5 passed, 4 failed, 3 skipped" ]] || { echo "FAIL: got '$last'"; exit 1; }
[[ $rc -eq 1 ]] || { echo "FAIL: exit code $rc, want 1"; exit 1; }

# All green -> exit 0.
ev //b:b_test PASSED "$T/b.xml" > "$T/bep2.json"
echo //b:b_test > "$T/expected2"
last=$(python3 "$SUMMARIZE" "$T/bep2.json" "$T/expected2" | tail -n 1)
[[ $last == "1 passed, 0 failed, 2 skipped" ]] || { echo "FAIL: got '$last'"; exit 1; }
echo PASS
