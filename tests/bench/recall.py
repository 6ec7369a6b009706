#!/usr/bin/env python3
"""Recall against `replay --pulsar` (docs/RECALL.md, docs/PERFORMANCE.md "Recall"): a spool holding
N minutes of a 1080p MJPEG camera at 30 fps (58 KB frames, ~14 Mbit/s), captured at `--speedup`
times the frame rate so that the bench does not wait N minutes; then, same run, the whole range
uploaded by the running rig on request (`rigd recall --wait`, time from the request to `done`) and
republished from a copy of the stopped rig's spool by `rigd replay --pulsar` (into a namespace of
its own). Both judged by the official client's message count.

    python3 tests/bench/recall.py [--minutes 10] [--speedup 10] [--url pulsar://127.0.0.1:6650]"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import ROOT, Rigd, namespace_with_dedup, rigd_bin, unique  # noqa: E402

FRAME_BYTES = 58_000

CONFIG = """
[rig]
id = "{rig}"
[[source]]
id = "front"
kind = "synthetic-camera"
width = 1920
height = 1080
fps = {fps}
frame-bytes = {frame_bytes}
upload = "on-request"
retain-age = "1d"
[pulsar]
url = "{url}"
topic = "persistent://{ns}/{{rig}}-{{source}}"
[spool]
path = "spool"
max-bytes = "8GiB"
[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""


def count(url, topic):
    sys.path.insert(0, str(ROOT / "tests" / "pulsar"))
    from consume import consume
    return len(consume(url, [topic], idle_timeout_s=5))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10, help="minutes of a 30 fps camera in the range")
    ap.add_argument("--speedup", type=float, default=10, help="captured at this many times 30 fps")
    ap.add_argument("--url", default="pulsar://127.0.0.1:6650")
    a = ap.parse_args()
    ns = namespace_with_dedup(unique("benchrecall"))
    ns_replay = namespace_with_dedup(unique("benchreplay"))
    rig = unique("br")
    frames_wanted = int(a.minutes * 60 * 30)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        d = Rigd(tmp, CONFIG.format(rig=rig, fps=30 * a.speedup, frame_bytes=FRAME_BYTES, url=a.url, ns=ns))
        d.start()
        try:
            d.wait_for(lambda s: next(x for x in s["sources"] if x["id"] == "front")["spooled_records"]
                       >= frames_wanted + 30, timeout=a.minutes * 60 / a.speedup * 3 + 60, what="the range captured")
        finally:
            assert d.stop() == 0
        # The same rig again, its camera at 1 fps: the range is what the spool holds.
        d = Rigd(tmp, CONFIG.format(rig=rig, fps=1, frame_bytes=FRAME_BYTES, url=a.url, ns=ns), name="rigd2")
        d.start()
        try:
            cov = json.loads(subprocess.run(
                [rigd_bin(), "recall", "--pulsar", a.url, "--rig", rig, "--control-topic",
                 f"persistent://{ns}/{{rig}}-control", "--coverage", "--json"],
                capture_output=True, text=True, check=True, timeout=120).stdout.splitlines()[-1])
            held = cov["sources"][0]["held"][0]
            frm = held["from"]
            # Exactly frames_wanted frames from the first held one: the range ends after the last.
            per_ns = 1e9 / (30 * a.speedup)
            to = frm + int(frames_wanted * per_ns) - int(per_ns / 2)
            t = time.time()
            out = subprocess.run(
                [rigd_bin(), "recall", "--pulsar", a.url, "--rig", rig, "--control-topic",
                 f"persistent://{ns}/{{rig}}-control", "--from", str(frm), "--to", str(to), "--wait", "--json",
                 "--timeout", "1800"], capture_output=True, text=True, timeout=3600)
            recall_s = time.time() - t
            assert out.returncode == 0, out.stderr[-2000:]
            done = json.loads(out.stdout.splitlines()[-1])
            assert done["state"] == "done", done
        finally:
            assert d.stop() == 0
        copy = tmp / "spool-copy"
        shutil.copytree(tmp / "spool", copy)
        t = time.time()
        r = subprocess.run([rigd_bin(), "replay", "--spool", str(copy), "--source", "front", "--from", str(frm),
                            "--to", str(to), "--pulsar", a.url, "--topic",
                            f"persistent://{ns_replay}/{{rig}}-{{source}}"], capture_output=True, text=True)
        replay_s = time.time() - t
        assert r.returncode == 0, r.stderr[-2000:]
        n_recall = count(a.url, f"persistent://{ns}/{rig}-front")
        n_replay = count(a.url, f"persistent://{ns_replay}/{rig}-front")
    mb = done["sent"]["bytes"] / 1e6
    print(f"| range | frames | MB | `rigd recall` to done | MB/s | `replay --pulsar` | MB/s | recall/replay |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {a.minutes:g} min of 1080p MJPEG 30 fps (captured at {a.speedup:g}x) | {done['sent']['frames']} "
          f"(topic: {n_recall}; replay's: {n_replay}) | {mb:.0f} | {recall_s:.1f} s | {mb / recall_s:.1f} | "
          f"{replay_s:.1f} s | {mb / replay_s:.1f} | {replay_s / recall_s:.2f}x |")
    assert done["sent"]["frames"] == n_recall == n_replay, (done, n_recall, n_replay)


if __name__ == "__main__":
    main()
