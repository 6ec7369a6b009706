#!/usr/bin/env python3
"""docs/TESTING.md's table of every e2e test before and after, from a run's lane results.

    python3 tests/durations_table.py [LANES_DIR] [--write]

LANES_DIR (default tests/artifacts/lanes, written by tests/run.sh) holds `<lane>.json`: each test's
seconds and outcome. One row per test function of those pytest collects in tests/e2e (a
parametrized one sums its cases), by file and place in it, the 4.0.7 lane's rows last. "before" is
the serial run of 2026-12-02 (tests/durations_serial.json); a test it lacks is "new (date)", the
date of the commit that added its `def`. Prints the table; --write puts it in docs/TESTING.md in
place of the old one."""

import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
args = [a for a in sys.argv[1:] if a != "--write"]
lanes_dir = Path(args[0]) if args else ROOT / "tests" / "artifacts" / "lanes"
before = json.loads((ROOT / "tests" / "durations_serial.json").read_text())
after = {}  # (test id, matrix?) -> (lane, seconds, outcome)
for f in sorted(lanes_dir.glob("*.json")):
    if f.name != "durations.json":
        for test, r in json.loads(f.read_text()).items():
            after[(test, f.stem == "matrix")] = (f.stem, r["seconds"], r["outcome"])
collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "tests/e2e"], cwd=ROOT,
                           capture_output=True, text=True).stdout
ids = [line for line in collected.splitlines() if line.startswith("tests/e2e/") and "::" in line]
assert ids, "pytest collected no e2e test"
groups = defaultdict(list)  # (function, matrix?) -> its ids
for matrix in (False, True):
    for test in ids:
        if not matrix or (test, True) in after:
            groups[(test.split("[")[0], matrix)].append(test)


def added(function: str) -> str:
    path, name = function.split("::")
    log = subprocess.run(["git", "log", "--format=%cs", "-S", f"def {name}(", "--", path], cwd=ROOT,
                         capture_output=True, text=True).stdout.split()
    return log[-1] if log else "not committed"


def place(group):  # file, then where the `def` is; the 4.0.7 rows last
    function, matrix = group
    path, name = function.split("::")
    return matrix, path, (ROOT / path).read_text().find(f"def {name}(")


rows, sums, counted = [], [0.0, 0.0], 0
for function, matrix in sorted(groups, key=place):
    tests = groups[(function, matrix)]
    suffix = " (4.0.7)" if matrix else ""
    known = [before[t + suffix] for t in tests if t + suffix in before]
    numbers = [v for v in known if isinstance(v, (int, float))]
    ran = [after[(t, matrix)] for t in tests if (t, matrix) in after]
    if not known:
        b = f"new ({added(function)})"
    elif len(numbers) < len(known):
        b = next(v for v in known if isinstance(v, str))
    else:
        b = f"{sum(numbers):.1f}" + (f" (+{len(tests) - len(known)} new cases)" if len(known) < len(tests) else "")
    failed = sum(1 for r in ran if r[2] != "passed")
    a = f"{sum(r[1] for r in ran):.1f}" + (f" ({failed} failed)" if failed else "") if ran else "not run"
    name = function.removeprefix("tests/e2e/") + (f"[{len(tests)} cases]" if len(tests) > 1 else "") + suffix
    rows.append(f"| `{name}` | {ran[0][0] if ran else '–'} | {b} | {a} |")
    sums[0] += sum(numbers)
    sums[1] += sum(r[1] for r in ran)
    counted += len(tests)
table = "\n".join(["| test | lane | before, s (serial) | after, s (in its lane) |", "|---|---|---:|---:|", *rows,
                   f"| **sum ({counted} tests in {len(rows)} rows)** | | **{sums[0]:.0f}** | **{sums[1]:.0f}** |"])
print(table)
if "--write" in sys.argv:
    doc = ROOT / "docs" / "TESTING.md"
    text, n = re.subn(r"^\| test \| lane \|.*?\n(?=\n|\Z)", table + "\n", doc.read_text(), count=1, flags=re.M | re.S)
    assert n == 1, "no per-test table in docs/TESTING.md"
    doc.write_text(text)
