#!/usr/bin/env python3
"""The live view's cost (issue 29): the full rig profile of tests/bench/rig_profile.py (1080p MJPEG
camera at 30 fps, 48 kHz stereo, 100 Hz serial, publishing live) first with no live-view client,
then with one Foxglove client (tests/web/live_client.mjs) subscribed to every channel on loopback.
Prints the rigd CPU of both windows (% of one core), the difference, and per topic the
capture-to-client latency (the rig clock is this host's CLOCK_REALTIME without PTP, so arrival on
the client's clock minus the message's receive time is the whole path: lane, encode, queue,
socket, the client's decode) as p50 / p99.

    python3 tests/bench/live_view.py [--secs 30] [--rounds 5] [--url pulsar://127.0.0.1:6650] [--no-broker]
                                     [--quick]

Rounds alternate a window without the client and one with it (the client connects for its window
and leaves), so that a shared machine's load drifting over the run falls on both alike; the figures
are the medians over the rounds, with the spread (lowest..highest) of the per-round difference.
--quick: one round of 2 s windows (the path runs; the figure means nothing).

--no-broker: the rig's uplink points at a closed port and its frames spool (capped at 64 MiB,
oldest dropped): the live view's cost without a broker at hand."""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import ROOT, Rigd, free_port, unique  # noqa: E402
from rig_profile import CONFIG, cpu_seconds  # noqa: E402

TOPICS = ["/front", "/mic", "/gps", "/gps/fix"]


def cpu_over(pid: int, secs: float) -> float:
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(secs)
    return 100 * (cpu_seconds(pid) - c0) / (time.monotonic() - t0)


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--secs", type=float, default=30)
    ap.add_argument("--url", default="pulsar://127.0.0.1:6650")
    ap.add_argument("--no-broker", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.secs, a.rounds = 2, 1
    work = Path(ROOT / "target" / "bench" / unique("live-view"))
    config = CONFIG.format(rig=unique("bench-live"), camera='format = "mjpeg"', spool_mode="on-outage", workers=2,
                           url=f"pulsar://127.0.0.1:{free_port()}" if a.no_broker else a.url)
    if a.no_broker:
        config = config.replace('path = "spool"', 'path = "spool"\nmax-bytes = "64MiB"\nwhen-full = "drop-oldest"')
    d = Rigd(work, config).start()
    try:
        d.wait_for(lambda s: all(x["published" if not a.no_broker else "frames"] > 0 for x in s["sources"]),
                   timeout=60, what="frames")
        time.sleep(3)
        subs = [x for t in TOPICS for x in ("--subscribe", t)]
        rounds = []
        for _ in range(a.rounds):
            idle = cpu_over(d.proc.pid, a.secs)
            client = subprocess.Popen(["node", str(ROOT / "tests/web/live_client.mjs"),
                                       f"ws://127.0.0.1:{d.port}/foxglove", "--protocol", "foxglove.sdk.v1", *subs,
                                       "--seconds", str(a.secs + 4)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            time.sleep(2)
            watched = cpu_over(d.proc.pid, a.secs)
            out, err = client.communicate(timeout=a.secs + 120)
            assert client.returncode == 0, err
            rounds.append((idle, watched, json.loads(out)))
        dropped = [s["live_dropped"] for s in d.status()["sources"]]
    finally:
        d.stop()
        d.close()
        shutil.rmtree(work, ignore_errors=True)
    idle = statistics.median(r[0] for r in rounds)
    watched = statistics.median(r[1] for r in rounds)
    added = [r[1] - r[0] for r in rounds]
    print(f"{a.rounds} rounds of {a.secs:.0f} s windows, without then with one client on every channel; "
          f"live drops {dropped}")
    print()
    print("| rigd CPU without (median) | with (median) | added, median of rounds | added, spread | goal |")
    print("|---:|---:|---:|---|---|")
    verdict = "met" if statistics.median(added) < 1 else "missed"
    print(f"| {idle:.1f} % | {watched:.1f} % | {statistics.median(added):+.1f} % | "
          f"{min(added):+.1f} .. {max(added):+.1f} % | < 1 % of a core: {verdict} |")
    print()
    print("| topic | messages | capture-to-client p50 | p99 | goal p99 < 50 ms |")
    print("|---|---:|---:|---:|---|")
    for topic in TOPICS:
        lat = [(int(r[2]["t0Ns"]) + m["at"] * 1e6 - int(m["receiveNs"])) / 1e6
               for r in rounds for m in r[2]["messages"] if m["topic"] == topic]
        p99 = quantile(lat, 0.99)
        print(f"| {topic} | {len(lat)} | {quantile(lat, 0.5):.1f} ms | {p99:.1f} ms | {'met' if p99 < 50 else 'missed'} |")

if __name__ == "__main__":
    main()
