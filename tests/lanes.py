#!/usr/bin/env python3
"""The end-to-end suite in lanes that run side by side (tests/run.sh calls this; docs/TESTING.md).

A lane is one pytest run over a set of tests that share what they hold:

  shared      the tests that only need a namespace of their own on the shared broker (started by
              tests/run.sh): pytest-xdist workers side by side
  own-broker  the tests that stop, freeze, restart or shape their broker (`holds_broker`): each
              worker starts a broker of its own (its data dir and ports), so they never meet the
              shared one or each other; several workers side by side
  vm          the QEMU guests (`vm`): CPU-bound TCG, one at a time, beside the broker-bound lanes
  cluster     the multi-node cluster (`cluster`): its nodes are a lane's own; after `vm`, so their
              JVMs never start beside a guest
  matrix      the core uplink, spool and wire-format tests again against the Pulsar 4.0.x line,
              each worker with a broker of that version of its own; after `shared`
  arm64       the aarch64 vehicle guest (`arm64`) on the cross-built .deb: only when RIGD_LANES
              names it (CI leaves it out: docs/TESTING.md); after `vm`, never beside another guest
  alone       the tests that measure rigd against a shaped link's capacity (`alone`: the estimator's
              tracking), with a broker of their own, after every other lane: beside the others on
              two cores their broker's receipts came late and read as the link's queue

Within a lane the tests start longest first (tests/durations.json; each run writes its own times
to tests/artifacts/lanes/durations.json to copy there), so a new
test costs its own wait, not a serial slot behind everything. Every lane's output is printed whole
when it ends, then the 15 slowest tests and each lane's wall time.

  tests/lanes.py [pytest args]       all lanes (-k etc. go to every lane; a lane with nothing
                                     selected passes)
  RIGD_LANES=shared,vm               only these lanes (`arm64` runs only when named here)
  RIGD_LANE_WORKERS=shared=4         another number of workers for a lane
  RIGD_MATRIX=0                      no matrix lane; RIGD_MATRIX_VERSION picks its version
  RIGD_LANE_TIMEOUT=2400             a lane still running after this many seconds is stopped and fails
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ART = ROOT / "tests" / "artifacts" / "lanes"
DURATIONS = ROOT / "tests" / "durations.json"
MATRIX_VERSION = os.environ.get("RIGD_MATRIX_VERSION", "4.0.7")
TIMEOUT_S = int(os.environ.get("RIGD_LANE_TIMEOUT", "2400"))
MATRIX_TESTS = ["tests/e2e/test_uplink.py", "tests/e2e/test_spool.py", "tests/e2e/test_publish.py"]


@dataclass
class Lane:
    name: str
    paths: list[str]
    marks: str | None
    workers: int
    env: dict[str, str] = field(default_factory=dict)
    after: str | None = None  # starts once these lanes (comma-separated) have ended
    proc: subprocess.Popen | None = None
    started: float = 0.0
    ended: float = 0.0
    rc: int | None = None

    @property
    def log(self) -> Path:
        return ART / f"{self.name}.log"

    @property
    def results(self) -> Path:
        return ART / f"{self.name}.json"


def own_broker_env(base: int, data: str, worker: int) -> dict[str, str]:
    """The broker of worker N in an own-broker lane: data dir `<data>-wN`, ports base + 10 N (+1 HTTP,
    +2 bookie). tests/conftest.py points a worker's tests at it; `stop_own_brokers` stops it."""
    port = base + 10 * worker
    return {"PULSAR_DATA": f"{data}-w{worker}", "PULSAR_PORT": str(port), "PULSAR_HTTP_PORT": str(port + 1),
            "PULSAR_BOOKIE_PORT": str(port + 2), "PULSAR_URL": f"pulsar://127.0.0.1:{port}",
            "PULSAR_ADMIN_URL": f"http://127.0.0.1:{port + 1}"}


def lanes() -> list[Lane]:
    shared = {"RIGD_SHARED_BROKER": "1"}
    own = lambda base, data: {"RIGD_OWN_BROKER_PORT_BASE": str(base), "RIGD_OWN_BROKER_DATA": str(data)}
    out = [
        Lane("shared", ["tests/e2e"], "not holds_broker and not vm and not cluster and not arm64", 3, shared),
        # Two workers: the lane (~2,200 s of tests) still ends before `vm`, with one broker JVM and
        # one heavy rig fewer beside the guest and the shared lane on two cores.
        Lane("own-broker", ["tests/e2e"], "holds_broker and not vm and not cluster and not alone", 2,
             own(6700, ROOT / "target" / "pulsar-data-own")),
        Lane("vm", ["tests/e2e"], "vm", 1, shared),
        Lane("cluster", ["tests/e2e"], "cluster", 1, shared, after="vm"),
    ]
    if os.environ.get("RIGD_MATRIX", "1") != "0":
        out.append(Lane("matrix", MATRIX_TESTS, None, 2,
                        {"PULSAR_VERSION": MATRIX_VERSION,
                         **own(6800, ROOT / "target" / f"pulsar-data-{MATRIX_VERSION}")},
                        after="shared"))
    only = os.environ.get("RIGD_LANES")
    if only and "arm64" in only.split(","):
        out.append(Lane("arm64", ["tests/e2e"], "arm64", 1, shared, after="vm"))
    out.append(Lane("alone", ["tests/e2e"], "alone", 1, own(6900, ROOT / "target" / "pulsar-data-alone"),
                    after=",".join(lane.name for lane in out)))
    if only:
        names = set(only.split(","))
        out = [lane for lane in out if lane.name in names]
        for lane in out:
            lane.after = ",".join(a for a in (lane.after or "").split(",") if a in names) or None
    for item in filter(None, os.environ.get("RIGD_LANE_WORKERS", "").split(",")):
        name, n = item.split("=")
        for lane in out:
            if lane.name == name:
                lane.workers = int(n)
    return out


def start(lane: Lane, args: list[str]):
    # A passed test's tmp_path is deleted at the lane's end (its spools, guests' disks, brokers' ledgers:
    # ~5 GB a run kept in /tmp otherwise, with what earlier runs left there a full disk mid-run); a
    # failed test's stays for its post-mortem.
    cmd = [sys.executable, "-m", "pytest", *lane.paths, "-v", "-rs", "-p", "no:cacheprovider",
           "-o", "tmp_path_retention_policy=failed", "--durations=0"]
    if lane.marks:
        cmd += ["-m", lane.marks]
    if lane.workers > 1:
        # in the order tests/conftest.py sorted them (longest first), not by group size
        cmd += ["-n", str(lane.workers), "--dist", "loadgroup", "--no-loadscope-reorder"]
    cmd += args
    env = {**os.environ, **lane.env, "RIGD_LANE": lane.name, "RIGD_LANE_RESULTS": str(lane.results)}
    lane.results.unlink(missing_ok=True)
    lane.log.write_text(f"$ {shlex.join(cmd)}\n")
    with open(lane.log, "a") as log:
        # its own process group, so that a lane past its deadline can be stopped whole
        lane.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
    lane.started = time.time()
    print(f"== lane {lane.name}: started ({lane.workers} worker{'s' * (lane.workers > 1)})", flush=True)


def stop(lane: Lane):
    """A lane past its deadline: SIGTERM to the process group it runs in (started by us, its pid
    recorded in `lane.proc`), SIGKILL 30 s later; its result is then a failure."""
    print(f"== lane {lane.name}: still running after {TIMEOUT_S} s, stopping it", flush=True)
    os.killpg(lane.proc.pid, signal.SIGTERM)
    try:
        lane.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(lane.proc.pid, signal.SIGKILL)
        lane.proc.wait()


def results(lane: Lane) -> list[tuple[str, float, str]]:
    """(test id, seconds, outcome) of each test the lane ran (tests/conftest.py writes them)."""
    if not lane.results.exists():
        return []
    return [(test, r["seconds"], r["outcome"]) for test, r in json.loads(lane.results.read_text()).items()]


def main() -> int:
    args = sys.argv[1:]
    ART.mkdir(parents=True, exist_ok=True)
    todo = lanes()
    t0 = time.time()
    running: list[Lane] = []
    done: list[Lane] = []
    while todo or running:
        ended = {d.name for d in done}
        for lane in [x for x in todo if x.after is None or set(x.after.split(",")) <= ended]:
            todo.remove(lane)
            start(lane, args)
            running.append(lane)
        for lane in list(running):
            if lane.proc.poll() is None:
                if time.time() - lane.started > TIMEOUT_S:
                    stop(lane)
                continue
            lane.rc, lane.ended = lane.proc.returncode, time.time()
            running.remove(lane)
            done.append(lane)
            verdict = "passed" if lane.rc in (0, 5) else f"FAILED (pytest exit {lane.rc})"
            print(f"\n== lane {lane.name}: {verdict} in {lane.ended - lane.started:.0f} s; its output:", flush=True)
            sys.stdout.write(lane.log.read_text(errors="replace"))
            print(f"== end of lane {lane.name}\n", flush=True)
        time.sleep(1)

    for lane in done:
        stop_own_brokers(lane)
    rows = [(lane.name, *r) for lane in done for r in results(lane)]
    print("== 15 slowest tests (all lanes)")
    for name, test, secs, outcome in sorted(rows, key=lambda r: -r[2])[:15]:
        print(f"{secs:8.1f} s  {name:10} {test}{'' if outcome == 'passed' else f'  ({outcome})'}")
    print(f"\n== lanes (wall {time.time() - t0:.0f} s)")
    for lane in done:
        n = [r for r in rows if r[0] == lane.name]
        busy = sum(r[2] for r in n)
        print(f"{lane.name:11} {lane.ended - lane.started:6.0f} s wall  {busy:6.0f} s of tests  "
              f"{len(n):3} tests  {'ok' if lane.rc in (0, 5) else 'FAILED'}")
    record(rows)
    for lane in done:
        if lane.rc not in (0, 5):
            print_failures(lane, [test for name, test, _, outcome in rows if name == lane.name and outcome != "passed"])
    return 0 if all(lane.rc in (0, 5) for lane in done) else 1


def print_failures(lane: Lane, failed: list[str]):
    """A failed lane's failures again, short, after the table: a CI log cut to its tail still says
    what failed in every lane (a whole lane's output is printed when it ends, far above)."""
    print(f"\n== lane {lane.name} failed: {', '.join(failed) or 'no test failed (pytest exit ' + str(lane.rc) + ')'}")
    text = lane.log.read_text(errors="replace").splitlines()
    # a guest's own failed checks first (the vehicle test's `vehicle: FAIL: ...` lines), then pytest's
    why = [line for line in text if re.search(r"vehicle: (FAIL:|.*\bfailed:)", line)]
    why += [line for line in text if line.startswith(("E ", "FAILED ", "ERROR ")) and line not in why]
    for line in why[:40]:
        print(f"  {line[:400]}")
    if len(why) > 40:
        print(f"  ... {len(why) - 40} more lines in {lane.log}")


def stop_own_brokers(lane: Lane):
    """A worker stops its own broker when it ends; one that died on the way leaves it running: stop
    it here by its data dir (broker.sh ends only the pid it recorded there)."""
    base = lane.env.get("RIGD_OWN_BROKER_PORT_BASE")
    if not base:
        return
    for n in range(lane.workers):
        env = {**os.environ, **lane.env, **own_broker_env(int(base), lane.env["RIGD_OWN_BROKER_DATA"], n)}
        if Path(env["PULSAR_DATA"]).exists():
            subprocess.run([str(ROOT / "tests/pulsar/broker.sh"), "stop"], env=env, capture_output=True)


def record(rows):
    """tests/artifacts/lanes/durations.json: each passed test's time in this run, merged into what
    tests/durations.json held (copy it there to keep the longest-first order up to date)."""
    known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    for lane, test, secs, outcome in rows:
        if outcome == "passed" and lane != "matrix":
            known[test] = round(secs, 1)
    (ART / "durations.json").write_text(json.dumps(dict(sorted(known.items())), indent=0) + "\n")


if __name__ == "__main__":
    sys.exit(main())
