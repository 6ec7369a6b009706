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

With `--rounds N` the outage is run N times and each figure is the median with the spread;
`--no-cpu` leaves out the budgeting CPU (two more minutes).

Needs root (tc) and the test broker (PULSAR_URL, PULSAR_ADMIN_URL as for the e2e tests).
Usage: sudo tests/bench/thin_link.py [--quick] [--rounds N] [--no-cpu]"""

import argparse
import os
import re
import statistics
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

ARGS = argparse.ArgumentParser()
ARGS.add_argument("--quick", action="store_true")
ARGS.add_argument("--rounds", type=int, default=1)
ARGS.add_argument("--no-cpu", action="store_true")
ARGS = ARGS.parse_args()
QUICK = ARGS.quick
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


def median_spread(xs, fmt):
    """`median (lowest-highest)` of a round's figures, or the figure alone for one round."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return "–"
    if len(xs) == 1:
        return fmt(xs[0])
    return f"{fmt(statistics.median(xs))} ({fmt(min(xs))}-{fmt(max(xs))})"


def main():
    import tempfile
    with tempfile.TemporaryDirectory(prefix="rigd-thin-bench-") as t:
        tmp = Path(t)
        rounds = [outage_and_drain(tmp / f"round{i}") for i in range(ARGS.rounds)]
        cpu = None if ARGS.no_cpu else budgeting_cpu(tmp)
    budget = BUDGET_KBIT * 1000 / 8
    live = [o["live_rate"] for o in rounds]
    drain = [o["drain_rate"] for o in rounds]
    share = [(o["drain_rate"] - o["live_rate"]) / (budget - o["live_rate"]) * 100 for o in rounds]
    waited = sum(o["cam_waited"] for o in rounds)
    ms = lambda v: f"{v * 1e3:.0f} ms"  # noqa: E731
    kbs = lambda v: f"{v / 1e3:.1f} kB/s"  # noqa: E731
    print(f"### Thin link: 2 Mbit/s htb class, max-bandwidth 1800 kbit/s, {OUTAGE_S} s outage, then the drain"
          f"{f' ({len(rounds)} rounds: median (lowest-highest))' if len(rounds) > 1 else ''}")
    print()
    print("| metric | value |")
    print("|---|---|")
    for src in SOURCES:
        frames = [o["p99"][src][1] for o in rounds]
        print(f"| {src} live p99 capture-to-receipt while the cam backlog waits | "
              f"{median_spread([o['p99'][src][0] for o in rounds], ms)} ({'/'.join(map(str, frames))} frames) |")
    print(f"| live bytes/s written (before the outage) | {median_spread(live, kbs)} of {budget / 1e3:.1f} kB/s |")
    print(f"| bytes/s written during the drain | {median_spread(drain, kbs)} |")
    print(f"| drain share of the budget left over | {median_spread(share, lambda v: f'{v:.0f} %')}"
          f"{'' if waited == len(rounds) else f' (cam backlog drained early in {len(rounds) - waited} rounds)'} |")
    if cpu:
        print(f"| rigd CPU, live, no budget | {cpu['unlimited'] * 100:.2f} % of a core |")
        print(f"| rigd CPU, live, with the budget | {cpu['budget'] * 100:.2f} % of a core |")
        print(f"| budgeting CPU (difference) | {(cpu['budget'] - cpu['unlimited']) * 100:.2f} % of a core |")


if __name__ == "__main__":
    main()
