#!/usr/bin/env python3
"""Summarizes a `bazel test` run from its build-event JSON file and gtest's XML reports.

  summarize_results.py BEP_JSON EXPECTED_LABELS_FILE [--extra NAME=passed|failed ...]

Counts test cases, not targets: a gtest case that ran and passed is "passed", one with a
<failure> is "failed", one that called GTEST_SKIP (or is disabled) is "skipped". A test target
that failed without a parsable report (crash, timeout, build failure) counts as one failure, as
does an expected test target with no result at all. Prints one line per target, then exactly
"N passed, N failed, N skipped"; exits 1 when anything failed.
"""
import json
import sys
import urllib.parse
import xml.etree.ElementTree as ET


def parse_gtest_xml(path):
    passed = failed = skipped = 0
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif (case.get("result") == "skipped" or case.get("status") == "notrun"
              or case.find("skipped") is not None):
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped


def main(argv):
    bep_path, expected_path = argv[1], argv[2]
    extras = [a.split("=", 1) for a in argv[3:] if a != "--extra"]
    results = {}  # label -> (status, xml path or None)
    with open(bep_path) as f:
        for line in f:
            event = json.loads(line)
            tid = event.get("id", {}).get("testResult")
            if not tid:
                continue
            res = event.get("testResult", {})
            xml = None
            for out in res.get("testActionOutput", []):
                if out.get("name") == "test.xml" and out.get("uri", "").startswith("file://"):
                    xml = urllib.parse.unquote(out["uri"][len("file://"):])
            # Keep the last attempt's result.
            results[tid["label"]] = (res.get("status", "NO_STATUS"), xml)
    with open(expected_path) as f:
        expected = [l.strip() for l in f if l.strip()]

    total = [0, 0, 0]
    for label in sorted(set(expected) | set(results)):
        status, xml = results.get(label, ("NO_RESULT (not built or not run)", None))
        counts = parse_gtest_xml(xml) if xml else None
        if counts is None:
            counts = (1, 0, 0) if status == "PASSED" else (0, 1, 0)
        elif status != "PASSED" and counts[1] == 0:
            counts = (counts[0], 1, counts[2])  # died after its cases, or timed out
        for i in range(3):
            total[i] += counts[i]
        print(f"{status:>10}  {label}: {counts[0]} passed, {counts[1]} failed, {counts[2]} skipped")
    for name, outcome in extras:
        ok = outcome == "passed"
        total[0 if ok else 1] += 1
        print(f"{'PASSED' if ok else 'FAILED':>10}  {name}")
    print(f"{total[0]} passed, {total[1]} failed, {total[2]} skipped")
    return 1 if total[1] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
