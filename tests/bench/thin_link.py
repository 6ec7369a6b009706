#!/usr/bin/env python3
"""The thin link's figures (issue 18): a rig through a 2 Mbit/s htb class on the broker's port
with `max-bandwidth = 1800kbit`, a 40 s outage (5 s with --quick), then the drain (not waited for with --quick). Prints one markdown table:

- live p99 capture-to-receipt (capture-ns against the broker's publish time, official client) of
  each source for frames captured while the camera's backlog waits;
- how much of the budget left over by the live frames the backlog drain uses (rigd's own count of
  the bytes its producers wrote, `rigd_source_uplink_bytes_total`, live before the outage against
  the drain after it);
- rigd's CPU for the budgeting: the same rig on an unshaped link, live (no backlog), with and
  without `max-bandwidth`, 60 s each (utime + stime of the process).

Needs root (tc) and the test broker (PULSAR_URL, PULSAR_ADMIN_URL as for the e2e tests).
Usage: sudo tests/bench/thin_link.py [--quick]"""

import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from harness import Rigd, namespace_with_dedup, unique  # noqa: E402
from test_thin_link import (BUDGET_KBIT, BROKER_PORT, LINK_KBIT, Link, by_id, config, latencies, p99,  # noqa: E402
                            received)

QUICK = "--quick" in sys.argv
OUTAGE_S = 5 if QUICK else 40
WARM = 5 if QUICK else 20  # frames each source has published before a measurement starts
SOURCES = ["gps", "mic", "cam"]


def uplink_bytes(d) -> int:
    text = d.get("/metrics").decode()
    return sum(int(float(v)) for v in re.findall(r'^rigd_source_uplink_bytes_total\{[^}]*\} (\S+)$', text, re.M))


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_share(d, secs: float) -> float:
    c0, t0 = cpu_s(d.proc.pid), time.time()
    time.sleep(secs)
    return (cpu_s(d.proc.pid) - c0) / (time.time() - t0)


def outage_and_drain(tmp: Path):
    ns, rig = namespace_with_dedup(unique("bench-thin")), unique("bthin")
    d = Rigd(tmp / "outage", config(ns, rig))
    out = {}
    try:
        with Link(LINK_KBIT, port=BROKER_PORT) as link:
            d.start()
            d.wait_for(lambda s: s["uplink"]["connected"] and all(x["published"] > WARM for x in s["sources"]),
                       timeout=60, what="publishing")
            time.sleep(1 if QUICK else 5)
            b0, t0 = uplink_bytes(d), time.time()
            time.sleep(2 if QUICK else 20)
            out["live_rate"] = (uplink_bytes(d) - b0) / (time.time() - t0)
            link.cut()
            time.sleep(OUTAGE_S)
            link.restore()
            d.wait_for(lambda s: s["uplink"]["connected"], timeout=60, what="uplink back")
            t_back = time.time()
            time.sleep(1 if QUICK else 5)
            b0, t0 = uplink_bytes(d), time.time()
            spooled = []
            while time.time() - t0 < (4 if QUICK else 60):
                time.sleep(2 if QUICK else 5)
                spooled.append(by_id(d.status(), "cam")["spooled_records"])
            out["drain_rate"] = (uplink_bytes(d) - b0) / (time.time() - t0)
            out["cam_waited"] = spooled[-1] > 0
            t_measured = time.time()
            link.restore(20_000)
            if not QUICK:  # the smoke run stops here: SIGTERM spools the rest (its figures mean nothing)
                d.wait_for(lambda s: s["spool"]["records"] == 0, timeout=600, interval=1, what="drained")
            assert d.stop() == 0
    finally:
        d.close()
    since, until = int(t_back * 1e9), int(t_measured * 1e9)
    out["p99"] = {}
    with ThreadPoolExecutor(len(SOURCES)) as pool:  # the sources' topics read side by side
        got = pool.map(lambda src: received(ns, rig, src, idle_s=3 if QUICK else 8), SOURCES)
        for src, msgs in zip(SOURCES, got):
            lat = latencies(msgs, since, until)
            out["p99"][src] = (p99(lat), len(lat))
    return out


def budgeting_cpu(tmp: Path):
    """CPU of the same live rig (below the budget: no backlog) with and without a budget."""
    res = {}
    secs = 1.5 if QUICK else 60
    for name, unlimited in [("unlimited", True), ("budget", False)]:
        ns, rig = namespace_with_dedup(unique("bench-cpu")), unique("bcpu")
        text = config(ns, rig)
        if unlimited:
            text = text.replace(f'max-bandwidth = "{BUDGET_KBIT}kbit"\n', "")
        d = Rigd(tmp / name, text)
        try:
            d.start()
            d.wait_for(lambda s: s["uplink"]["connected"] and all(x["published"] > WARM for x in s["sources"]),
                       timeout=60, what="publishing")
            time.sleep(0.5 if QUICK else 3)
            res[name] = cpu_share(d, secs)
            assert d.stop() == 0
        finally:
            d.close()
    return res


def main():
    import tempfile
    with tempfile.TemporaryDirectory(prefix="rigd-thin-bench-") as t:
        tmp = Path(t)
        o = outage_and_drain(tmp)
        cpu = budgeting_cpu(tmp)
    budget = BUDGET_KBIT * 1000 / 8
    leftover = budget - o["live_rate"]
    used = o["drain_rate"] - o["live_rate"]
    print(f"### Thin link: 2 Mbit/s htb class, max-bandwidth 1800 kbit/s, {OUTAGE_S} s outage, then the drain")
    print()
    print("| metric | value |")
    print("|---|---|")
    for src in SOURCES:
        v, n = o["p99"][src]
        print(f"| {src} live p99 capture-to-receipt while the cam backlog waits | "
              f"{'–' if v is None else f'{v * 1e3:.0f} ms'} ({n} frames) |")
    print(f"| live bytes/s written (before the outage) | {o['live_rate'] / 1e3:.1f} kB/s of {budget / 1e3:.1f} kB/s |")
    print(f"| bytes/s written during the drain | {o['drain_rate'] / 1e3:.1f} kB/s |")
    print(f"| drain share of the budget left over | {used / leftover * 100:.0f} % "
          f"({used / 1e3:.1f} of {leftover / 1e3:.1f} kB/s){'' if o['cam_waited'] else ' (cam backlog drained early)'} |")
    print(f"| rigd CPU, live, no budget | {cpu['unlimited'] * 100:.2f} % of a core |")
    print(f"| rigd CPU, live, with the budget | {cpu['budget'] * 100:.2f} % of a core |")
    print(f"| budgeting CPU (difference) | {(cpu['budget'] - cpu['unlimited']) * 100:.2f} % of a core |")


if __name__ == "__main__":
    main()
