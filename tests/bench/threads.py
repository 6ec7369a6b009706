#!/usr/bin/env python3
"""A running process's CPU and context switches by thread name over a window, from the kernel's
own per-thread accounting (`/proc/PID/task/*/schedstat`: nanoseconds on a CPU; `status`:
voluntary and involuntary switches). Where a per-frame cost goes when perf samples are too few.

    python3 tests/bench/threads.py <pid> [--secs 20]"""

import argparse
import time
from pathlib import Path


def sample(pid):
    """{tid: (name, cpu ns, switches)} of every thread alive now."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            ns = int((task / "schedstat").read_text().split()[0])
            name = (task / "comm").read_text().strip()
            switches = sum(int(line.split()[1]) for line in (task / "status").read_text().splitlines()
                           if "ctxt_switches" in line)
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
        out[task.name] = (name, ns, switches)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pid", type=int)
    ap.add_argument("--secs", type=float, default=20)
    a = ap.parse_args()
    before, t0 = sample(a.pid), time.monotonic()
    time.sleep(a.secs)
    after, t1 = sample(a.pid), time.monotonic()
    dt = t1 - t0
    cpu, switches = {}, {}
    for tid, (name, ns, sw) in after.items():
        _, ns0, sw0 = before.get(tid, (name, 0, 0))
        cpu[name] = cpu.get(name, 0) + ns - ns0
        switches[name] = switches.get(name, 0) + sw - sw0
    total = sum(cpu.values())
    print(f"pid {a.pid}, {dt:.0f} s: {100 * total / 1e9 / dt:.2f} % of one core, "
          f"{sum(switches.values()) / dt:.0f} switches/s")
    print("| thread | % of one core | switches/s |")
    print("|---|---|---|")
    for name in sorted(cpu, key=lambda n: -cpu[n]):
        if cpu[name] or switches[name]:
            print(f"| {name} | {100 * cpu[name] / 1e9 / dt:.2f} | {switches[name] / dt:.0f} |")


if __name__ == "__main__":
    main()
