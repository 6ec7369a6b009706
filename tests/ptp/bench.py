#!/usr/bin/env python3
"""Benchmark of rigd's PTP clock against ptp4l (as root): time to lock, true error RMS/max after
lock, CPU of the PTP task, for UDPv4 and L2 at 1 Hz and 8 Hz sync. Prints a Markdown table.

    cargo build --release --locked && sudo tests/ptp/bench.py [--seconds 30] [--start-off]

Each run: fresh namespaces, a ptp4l grandmaster (software timestamps, announce every 1 s, sync and
delay requests at the rate under test), rigd starting 300 ms off with a simulated +50 ppm oscillator
(--no-start-off: starting on time). True error = rig clock minus the host's CLOCK_REALTIME (shared
by all namespaces), read from rigd's status every 100 ms for --seconds after lock."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ptpnet import PtpNet, RigInNetns, host_clock_frequency, remove_stale, stats_ns  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def one(transport: str, log_sync: int, seconds: float, start_off: bool, workdir: Path) -> dict:
    remove_stale()
    net = PtpNet(workdir / f"{transport}{log_sync}", transport)
    try:
        net.up()
        net.start_gm("gm1", priority1=10, log_sync=log_sync, log_announce=0)
        time.sleep(4)  # ptp4l takes ~3-4 s to become master; time to lock is counted from rigd's start
        rig = RigInNetns(net, os.environ.get("RIGD_BIN", str(ROOT / "target/release/rigd")),
                         log_sync=log_sync, log_announce=0,
                         offset_ns=300_000_000 if start_off else 0, ppm=50.0 if start_off else 0.0)
        t0 = time.time()
        rig.start()
        c = rig.wait_clock(lambda c: c["state"] == "locked", 120, "lock")
        lock_s = time.time() - t0
        cpu0, w0 = c["task_cpu_ms"], time.time()
        samples = rig.sample_errors(seconds)
        c = rig.clock()
        cpu = (c["task_cpu_ms"] - cpu0) / 1000 / (time.time() - w0)
        st = stats_ns([s["realtime_error_ns"] for s in samples])
        unlocked = sum(1 for s in samples if s["state"] != "locked")
        rig.stop()
        return {"transport": transport, "sync_hz": 2 ** -log_sync, "lock_s": lock_s,
                "steps": c["steps"], "cpu": cpu, "unlocked": unlocked, **st}
    finally:
        net.down()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30, help="error sampling time after lock")
    ap.add_argument("--no-start-off", dest="start_off", action="store_false",
                    help="start on time instead of 300 ms off and +50 ppm")
    ap.add_argument("--transport", action="append", choices=["udp4", "l2"])
    ap.add_argument("--log-sync", action="append", type=int, help="log2 sync interval (0 = 1 Hz, -3 = 8 Hz)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("bench.py needs root (network namespaces)", file=sys.stderr)
        return 2
    freq0 = host_clock_frequency()
    rows = []
    with tempfile.TemporaryDirectory(prefix="rigd-ptp-bench-") as d:
        for transport in a.transport or ["udp4", "l2"]:
            for log_sync in a.log_sync or [0, -3]:
                r = one(transport, log_sync, a.seconds, a.start_off, Path(d))
                print(f"  {r}", file=sys.stderr)
                rows.append(r)
    assert host_clock_frequency() == freq0, "host clock frequency changed"
    print(f"start: {'300 ms off, +50 ppm' if a.start_off else 'on time'}; error sampled every 100 ms "
          f"for {a.seconds:.0f} s after lock; host clock frequency unchanged ({freq0[0]})\n")
    print("| transport | sync | time to lock | steps | error RMS | error max | p95 | samples not locked | PTP task CPU |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['transport']} | {r['sync_hz']:g} Hz | {r['lock_s']:.1f} s | {r['steps']} | "
              f"{r['rms'] / 1000:.2f} us | {r['max'] / 1000:.2f} us | {r['p95'] / 1000:.2f} us | "
              f"{r['unlocked']}/{r['n']} | {r['cpu'] * 100:.2f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
