#!/usr/bin/env python3
"""The live view's cost (issue 29): the full rig profile of tests/bench/rig_profile.py (1080p MJPEG
camera at 30 fps, 48 kHz stereo, 100 Hz serial, publishing live) first with no live-view client,
then with one Foxglove client (tests/web/live_client.mjs) subscribed to every channel on loopback.
Prints the rigd CPU of both windows (% of one core), the difference, and per topic the
capture-to-client latency (the rig clock is this host's CLOCK_REALTIME without PTP, so arrival on
the client's clock minus the message's receive time is the whole path: lane, encode, queue,
socket, the client's decode) as p50 / p99.

    python3 tests/bench/live_view.py [--secs 30] [--url pulsar://127.0.0.1:6650] [--no-broker]

--no-broker: the rig's uplink points at a closed port and its frames spool (capped at 64 MiB,
oldest dropped): the live view's cost without a broker at hand."""

import argparse
import json
import shutil
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
    a = ap.parse_args()
    work = Path(ROOT / "target" / "bench" / unique("live-view"))
    config = CONFIG.format(rig=unique("bench-live"), format="mjpeg",
                           url=f"pulsar://127.0.0.1:{free_port()}" if a.no_broker else a.url)
    if a.no_broker:
        config = config.replace('path = "spool"', 'path = "spool"\nmax-bytes = "64MiB"\nwhen-full = "drop-oldest"')
    d = Rigd(work, config).start()
    try:
        d.wait_for(lambda s: all(x["published" if not a.no_broker else "frames"] > 0 for x in s["sources"]),
                   timeout=60, what="frames")
        time.sleep(3)
        idle = cpu_over(d.proc.pid, a.secs)
        subs = [x for t in TOPICS for x in ("--subscribe", t)]
        client = subprocess.Popen(["node", str(ROOT / "tests/web/live_client.mjs"), f"ws://127.0.0.1:{d.port}/foxglove",
                                   "--protocol", "foxglove.sdk.v1", *subs, "--seconds", str(a.secs + 4)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(2)
        watched = cpu_over(d.proc.pid, a.secs)
        out, err = client.communicate(timeout=a.secs + 120)
        assert client.returncode == 0, err
        report = json.loads(out)
        dropped = [s["live_dropped"] for s in d.status()["sources"]]
    finally:
        d.stop()
        d.close()
        shutil.rmtree(work, ignore_errors=True)
    t0 = int(report["t0Ns"])
    print(f"window {a.secs:.0f} s each; rigd CPU without a client {idle:.1f} %, with one client on every channel "
          f"{watched:.1f} % (added {watched - idle:+.1f} % of one core); live drops {dropped}")
    for topic in TOPICS:
        lat = [(t0 + m["at"] * 1e6 - int(m["receiveNs"])) / 1e6 for m in report["messages"] if m["topic"] == topic]
        rate = len(lat) / (a.secs + 4)
        print(f"{topic}: {len(lat)} messages ({rate:.0f}/s), capture-to-client p50 {quantile(lat, 0.5):.1f} ms, "
              f"p99 {quantile(lat, 0.99):.1f} ms")


if __name__ == "__main__":
    main()
