#!/usr/bin/python3
"""Counts the test cases of one CI run from Bazel's build event files.

Usage: count.py EXPECTED_DIR BEP_FILE... [--fuzz NAME=ok|fail ...]

Each BEP_FILE is the --build_event_json_file of one `bazel test` invocation,
and EXPECTED_DIR/<basename of BEP_FILE>.targets lists (one label a line) the
test targets that invocation had to run. Only what these files name is read,
so test.xml files left by earlier invocations under bazel-out never count.

Rules (what `.ci/run` promises):
  - Every attempt counts: a target that failed and passed on a retry adds
    its failed cases too. Each attempt's test.xml is read; a test case with
    <failure> or <error> is failed, one with result="skipped" or <skipped>
    (GTEST_SKIP) or status="notrun" is skipped, any other is passed.
  - An attempt that did not pass but whose XML shows no failed case (a
    crash after the cases ran, a sanitizer report at exit, a timeout, no
    XML at all) adds one failed case named after the target.
  - A result served from a cache is not a run: it counts as failed.
  - An expected target with no result in its invocation (it failed to
    build, the build stopped, analysis failed) counts as one failed case.
  - Fuzz runs (`--fuzz NAME=ok|fail`) count one case each.
Prints the per-problem lines, then "N passed, N failed, N skipped" alone on
the last line. Exit status 1 if a target's last attempt did not pass, a
target was retried that is not on the reviewed list (.ci/retry-allowed), a
result was cached or an expected target did not run; else 0 (a listed
target that failed once and passed on its retry still adds its failed
cases to the count, and is printed).
"""
import json
import pathlib
import sys
import urllib.parse
import xml.etree.ElementTree as ET


def xml_cases(path):
  """Returns (passed, failed, skipped) of one test.xml, or None if unreadable."""
  try:
    root = ET.parse(path).getroot()
  except (ET.ParseError, OSError):
    return None
  passed = failed = skipped = 0
  for case in root.iter("testcase"):
    if case.find("failure") is not None or case.find("error") is not None:
      failed += 1
    elif (case.get("result") == "skipped" or case.find("skipped") is not None
          or case.get("status") == "notrun"):
      skipped += 1
    else:
      passed += 1
  return passed, failed, skipped


def uri_path(uri):
  return pathlib.Path(urllib.parse.unquote(urllib.parse.urlparse(uri).path))


def main(argv):
  expected_dir = pathlib.Path(argv[1])
  beps, fuzz = [], []
  args = iter(argv[2:])
  for a in args:
    if a == "--fuzz":
      fuzz.append(next(args))
    else:
      beps.append(pathlib.Path(a))
  allowed = set()
  allowed_file = pathlib.Path(__file__).with_name("retry-allowed")
  if allowed_file.exists():
    for line in allowed_file.read_text().splitlines():
      line = line.strip()
      if line and not line.startswith("#"):
        allowed.add(line.split()[0])

  passed = failed = skipped = 0
  problems, bad = [], False
  for bep in beps:
    run = bep.stem
    results = {}  # label -> list of (attempt, status, xml path, cached)
    if bep.exists():
      for line in bep.read_text().splitlines():
        try:
          event = json.loads(line)
        except json.JSONDecodeError:
          continue
        tid = event.get("id", {}).get("testResult")
        if tid is None or "testResult" not in event:
          continue
        r = event["testResult"]
        xml = None
        for out in r.get("testActionOutput", []):
          if out.get("name") == "test.xml":
            xml = uri_path(out["uri"])
        cached = bool(r.get("cachedLocally")) or bool(
            r.get("executionInfo", {}).get("cachedRemotely"))
        results.setdefault(tid["label"], []).append(
            (tid.get("attempt", 1), r.get("status", "NO_STATUS"), xml, cached))
    expected_file = expected_dir / (bep.stem + ".targets")
    expected = []
    if expected_file.exists():
      expected = [l.strip() for l in expected_file.read_text().splitlines() if l.strip()]
    for label in expected:
      if label not in results:
        failed += 1
        bad = True
        problems.append(f"did not run ({run}): {label}")
    for label, attempts in sorted(results.items()):
      for attempt, status, xml, cached in sorted(attempts, key=lambda a: a[0]):
        if cached:
          failed += 1
          bad = True
          problems.append(f"cached, not run ({run}): {label}")
          continue
        counts = xml_cases(xml) if xml is not None else None
        p, f, s = counts if counts is not None else (0, 0, 0)
        if status != "PASSED" and f == 0:
          f = 1
        if status == "PASSED" and counts is None:
          p = 1  # a passing target without readable XML is one case
        passed, failed, skipped = passed + p, failed + f, skipped + s
        if status != "PASSED":
          problems.append(f"{status.lower()} ({run}, attempt {attempt}): {label}")
      if len(attempts) > 1:
        if label in allowed:
          problems.append(f"retried, on .ci/retry-allowed ({run}): {label}")
        else:
          bad = True
          problems.append(f"retried, NOT on .ci/retry-allowed ({run}): {label}")
      final = max(attempts, key=lambda a: a[0])[1]
      if final != "PASSED":
        bad = True
  for f in fuzz:
    name, _, outcome = f.partition("=")
    if outcome == "ok":
      passed += 1
    else:
      failed += 1
      bad = True
      problems.append(f"fuzz failed: {name}")
  for p in problems:
    print(p)
  print(f"{passed} passed, {failed} failed, {skipped} skipped")
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
