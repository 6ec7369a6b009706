#!/usr/bin/env python3
"""Where rigd's CPU goes, by stage (issue 26: the rig's own cost located, not guessed).

Reads a `perf record -g` profile of a running rigd and puts every sample into one stage by its
thread and call stack: capture (the capture threads), lane (`pipeline`), window/encode (the window,
payload, sealing and protobuf encoding), socket (the uplink session's reads and writes, down into the
kernel's TCP), spool (the spool and sled, commits and fdatasync), status/metrics (status, metrics,
the web server), runtime (tokio's scheduler with no rigd frame on the stack: parking, waking,
epoll), other. A sample's stage is that of the innermost rigd frame on its stack.

    perf record -F 999 -g -p "$(pidof-the-rigd-you-started)" -o perf.data -- sleep 30
    tests/bench/stages.py perf.data --secs 30 --hz 999

`--secs`/`--hz` turn sample counts into % of one core (samples / (secs x hz))."""

import argparse
import collections
import subprocess

STAGES = ["capture", "lane", "window/encode", "socket", "spool", "status/metrics", "runtime", "other"]

# (prefix of a symbol, stage), innermost rigd frame first; the first prefix that matches wins.
RIGD = [
    ("rigd::pipeline", "lane"),
    ("rigd::uplink::window", "window/encode"),
    ("rigd::payload", "window/encode"),
    ("rigd::seal", "window/encode"),
    ("rigd::uplink::codec", "window/encode"),
    ("rigd::uplink", "socket"),
    ("rigd::spool", "spool"),
    ("sled::", "spool"),
    ("rigd::status", "status/metrics"),
    ("rigd::metrics", "status/metrics"),
    ("rigd::notify", "status/metrics"),
    ("rigd::runtime", "status/metrics"),
    ("rigd_web", "status/metrics"),
    ("axum::", "status/metrics"),
    ("hyper::", "status/metrics"),
    ("rigd_drivers", "capture"),
]


def stage_of(comm: str, frames: list[str]) -> str:
    if comm.startswith("capture-"):
        return "capture"
    if comm.startswith("sled-"):
        return "spool"
    for sym in frames:  # innermost first
        for prefix, stage in RIGD:
            if sym.startswith(prefix) or sym.startswith("<" + prefix):
                return stage
    if any(s.startswith(("tokio::", "<tokio::", "mio::", "epoll_wait", "syscall")) for s in frames):
        return "runtime"
    return "other"


def samples(path: str):
    out = subprocess.run(["perf", "script", "-i", path, "-F", "comm,ip,sym"], capture_output=True,
                         text=True, check=True).stdout
    comm, frames = None, []
    for line in out.splitlines():
        if not line.strip():
            if comm is not None:
                yield comm, frames
            comm, frames = None, []
        elif not line[0].isspace():
            comm, frames = line.split()[0], []
        else:
            parts = line.split(None, 1)
            frames.append(parts[1] if len(parts) > 1 else "")
    if comm is not None:
        yield comm, frames


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("perf_data")
    ap.add_argument("--secs", type=float, required=True)
    ap.add_argument("--hz", type=float, default=999)
    a = ap.parse_args()
    counts = collections.Counter(stage_of(c, f) for c, f in samples(a.perf_data))
    total = sum(counts.values())
    budget = a.secs * a.hz
    print(f"| stage | samples | share | % of one core |")
    print("|---|---|---|---|")
    for s in STAGES:
        n = counts.get(s, 0)
        print(f"| {s} | {n} | {100 * n / max(total, 1):.1f} % | {100 * n / budget:.2f} % |")
    print(f"| all | {total} | 100 % | {100 * total / budget:.2f} % |")


if __name__ == "__main__":
    main()
