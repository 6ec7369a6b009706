#!/usr/bin/env python3
"""The full rig profile of tests/bench/run.sh: rigd with a synthetic 1080p camera at 30 fps, 48 kHz
stereo audio and a 100 Hz serial source publishing live to the broker; measures rigd's CPU (% of one
core), peak RSS, publish rates, then (first profile only) the same during a broker outage and the
drain after. One profile per camera format side by side: `mjpeg` (pre-encoded JPEGs, as an MJPEG
camera hands over) and `yuyv` (raw frames rigd encodes to JPEG, as a raw V4L2 camera's), and with
--rigd-without-turbojpeg the yuyv profile again on the pure-Rust encoder. Video (issue 48,
tests/bench/video.sh): `h264` (the textured pan encoded by rigd, `codec = "h264"` at --bitrate) and
`h264-clip` (an H.264 passthrough camera's stand-in: the access units of --clip handed over in a
loop, nothing encoded). Issue 49: `proxy4` (four 1080p30 H.264 cameras held on request with
their 854x480 proxies live) and `h264x4` (the same without proxies), with the capture threads'
CPU per picture (`/proc/PID/task/*/schedstat` of the `capture-cam*` threads).

    python3 tests/bench/rig_profile.py --secs 60 --outage-secs 30 \
        [--formats mjpeg,yuyv,h264,h264-clip --clip FILE.h264] [--spool-mode always] \
        [--rigd-without-turbojpeg target/bench/rigd-without-turbojpeg]"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import ROOT, Rigd, unique  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK


def status_kb(pid, key):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def quantile_from_metrics(text, name, source, q):
    """p-quantile of a Prometheus histogram `name` for label source=..., or None."""
    buckets = []
    for line in text.splitlines():
        if line.startswith(name + "_bucket{") and f'source="{source}"' in line:
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    if not buckets or buckets[-1][1] == 0:
        return None
    buckets.sort()
    total = buckets[-1][1]
    for le, c in buckets:
        if c >= q * total:
            return le
    return None


CONFIG = """
[rig]
id = "{rig}"
worker-threads = {workers}
[[source]]
id = "front"
kind = "synthetic-camera"
width = 1920
height = 1080
fps = 30
{camera}
[[source]]
id = "mic"
kind = "synthetic-audio"
sample-rate = 48000
channels = 2
[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 100
[pulsar]
url = "{url}"
[spool]
path = "spool"
mode = "{spool_mode}"
[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""


# The four-camera rig of issue 49 (`--formats proxy4,h264x4`): four 1080p30 H.264 cameras, full
# resolution held on the rig for recall, each with its 854x480 proxy live (proxy4) or without one
# (h264x4, the proxy's cost by difference), beside the profile's audio and serial.
FOUR_CAMERAS = """
[[source]]
id = "cam{n}"
kind = "synthetic-camera"
width = 1920
height = 1080
fps = 30
codec = "h264"
bitrate = "{bitrate}"
upload = "on-request"
retain-age = "10m"
encoder = "software"
{proxy}
"""


def capture_cpu_ns(pid):
    """CPU ns of the capture threads (`capture-{source}`), summed, from the kernel's accounting."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "comm").read_text().startswith("capture-cam"):
                total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--secs", type=float, default=60)
    ap.add_argument("--url", default="pulsar://127.0.0.1:6650")
    ap.add_argument("--outage-secs", type=float, default=30,
                    help="then stop the broker this long, in the first profile only (0: skip)")
    ap.add_argument("--formats", default="mjpeg,yuyv",
                    help="the camera's `format` per profile, side by side (yuyv: raw frames rigd encodes; "
                         "h264: the pan encoded by rigd; h264-clip: --clip handed over; "
                         "+encrypted: with end-to-end encryption)")
    ap.add_argument("--worker-threads", type=int, default=2, help="`[rig] worker-threads`")
    ap.add_argument("--spool-mode", default="on-outage", choices=["on-outage", "always"],
                    help="`[spool] mode`: always = every frame durable in the spool before it is sent")
    ap.add_argument("--clip", type=Path, help="the H.264 file (Annex B) the h264-clip profile hands over")
    ap.add_argument("--bitrate", default="2mbit", help="the h264 profile's `bitrate`")
    ap.add_argument("--rigd-without-turbojpeg", type=Path,
                    help="a rigd built without the `turbojpeg` feature: one more yuyv profile, pure-Rust encoder")
    a = ap.parse_args()
    runs = [(f, None) for f in a.formats.split(",")]
    if a.rigd_without_turbojpeg:
        runs.append(("yuyv", a.rigd_without_turbojpeg.resolve()))
    columns = []
    for i, (fmt, binary) in enumerate(runs):
        columns.append(profile(a, fmt, binary, outage_secs=a.outage_secs if i == 0 else 0))
    metrics = []
    for col in columns:
        metrics += [m for m in col if m not in metrics]
    print("| metric | " + " | ".join(col["profile"] for col in columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for m in metrics:
        if m != "profile":
            print(f"| {m} | " + " | ".join(col.get(m, "—") for col in columns) + " |")


def profile(a, fmt, binary, outage_secs):
    """One rig profile with the camera in `fmt`; returns {metric: value} (key "profile": its name)."""
    rig = unique("profile")
    fmt, _, variant = fmt.partition("+")
    if fmt in ("h264", "proxy4", "h264x4"):
        camera = f'codec = "h264"\nbitrate = "{a.bitrate}"'
    elif fmt == "h264-clip":
        camera = f'codec = "h264"\nclip = "{a.clip.resolve()}"'
    else:
        camera = f'format = "{fmt}"'
    cfg = CONFIG.format(rig=rig, camera=camera, url=a.url, spool_mode=a.spool_mode,
                        workers=a.worker_threads)
    if fmt in ("proxy4", "h264x4"):
        proxy = 'proxy = { width = 854, height = 480, bitrate = "300kbit" }' if fmt == "proxy4" else ""
        cams = "".join(FOUR_CAMERAS.format(n=n, bitrate=a.bitrate, proxy=proxy) for n in range(1, 5))
        start, end = cfg.index('[[source]]\nid = "front"'), cfg.index('[[source]]\nid = "mic"')
        cfg = cfg[:start] + cams.lstrip("\n") + cfg[end:]
    default_bin = os.environ.get("RIGD_BIN")
    if binary:
        os.environ["RIGD_BIN"] = str(binary)  # what the harness's Rigd starts
    rows = {}
    stopped = False
    with tempfile.TemporaryDirectory() as tmp:
        if variant == "encrypted":
            # End-to-end encryption for a fleet RSA-2048 key (issue 19's cost goal).
            key = Path(tmp) / "fleet.key.pem"
            subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True)
            subprocess.run(["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(Path(tmp) / "fleet.pem")],
                           check=True, capture_output=True)
            cfg = cfg.replace("[pulsar]\n", f'[pulsar]\nencryption-key-file = "{Path(tmp) / "fleet.pem"}"\n'
                              'encryption-key-name = "bench"\n')
        d = Rigd(Path(tmp), cfg).start()
        try:
            d.wait_for(lambda s: s["uplink"]["connected"], timeout=60, what="connected")
            time.sleep(2)  # warm-up: caches filled, connections up
            pid = d.proc.pid
            s0, c0, t0, k0 = d.status(), cpu_seconds(pid), time.time(), capture_cpu_ns(pid)
            time.sleep(a.secs)
            s1, c1, t1, k1 = d.status(), cpu_seconds(pid), time.time(), capture_cpu_ns(pid)
            cpu = 100 * (c1 - c0) / (t1 - t0)
            rss = status_kb(pid, "VmHWM") / 1024
            try:
                metrics = d.get("/metrics").decode()
            except OSError:
                metrics = ""
            log = d.log_path.read_text(errors="replace")
            if fmt == "proxy4":
                name = f"four 1080p30 H.264 cameras ({a.bitrate}, held on request) + 854x480 proxies live"
            elif fmt == "h264x4":
                name = f"four 1080p30 H.264 cameras ({a.bitrate}, held on request), no proxy"
            elif fmt == "mjpeg":
                name = "1080p MJPEG camera"
            elif fmt == "h264":
                name = f"1080p H.264 camera encoded by rigd (OpenH264, {a.bitrate})"
            elif fmt == "h264-clip":
                name = f"1080p H.264 passthrough (a {a.clip.stat().st_size / 1e6:.1f} MB clip looped)"
            elif binary:
                name = "1080p YUYV camera, jpeg-encoder (built without `turbojpeg`)"
            elif "libturbojpeg not available" in log:
                name = "1080p YUYV camera, jpeg-encoder (libturbojpeg absent)"
            else:
                name = "1080p YUYV camera, libturbojpeg"
            rows["profile"] = (name + (", encrypted" if variant == "encrypted" else "")
                               + (", spool mode always" if a.spool_mode == "always" else ""))
            rows["window"] = f"{t1 - t0:.0f} s"
            rows["rigd CPU (% of one core)"] = f"{cpu:.1f} %"
            rows["rigd peak RSS (VmHWM)"] = f"{rss:.1f} MiB"
            rows["rigd RSS at the window's end (VmRSS)"] = f"{status_kb(pid, 'VmRSS') / 1024:.1f} MiB"
            if fmt in ("proxy4", "h264x4"):
                cams = [(x0, x1) for x0, x1 in zip(s0["sources"], s1["sources"]) if x1["id"].startswith("cam")
                        and x1["kind"] != "proxy"]
                pictures = sum(x1["frames"] - x0["frames"] for x0, x1 in cams)
                share = (k1 - k0) / 1e9 / (t1 - t0) * 100
                rows["capture threads (draw + encodes + proxy scale) CPU"] = (
                    f"{share:.1f} % of a core, {(k1 - k0) / 1e6 / max(pictures, 1):.1f} ms per picture "
                    f"({pictures / (t1 - t0):.1f} pictures/s over 4 cameras)")
            for a0, a1 in zip(s0["sources"], s1["sources"]):
                rate = (a1["frames"] - a0["frames"]) / (t1 - t0)
                mbps = (a1["bytes"] - a0["bytes"]) / (t1 - t0) / 1e6
                p99 = quantile_from_metrics(metrics, "rigd_capture_to_receipt_seconds", a1["id"], 0.99)
                lat = f", capture-to-receipt p99 <= {p99 * 1e3:.1f} ms" if p99 else ""
                rows[f"{a1['id']} ({a1['kind']})"] = (f"{rate:.1f} frames/s, {mbps:.2f} MB/s, "
                                                      f"drops {a1['drops'] - a0['drops']}{lat}")
            rows["published (all sources)"] = str(s1["uplink"]["published"] - s0["uplink"]["published"])
            if outage_secs > 0:
                stopped = True
                rows.update(outage(d, outage_secs))
            assert d.stop() == 0
        finally:
            d.close()
            if default_bin is None:
                os.environ.pop("RIGD_BIN", None)
            else:
                os.environ["RIGD_BIN"] = default_bin
            if stopped:
                broker_ctl("start")  # leave the broker running whatever happened
    return rows


def broker_ctl(cmd):
    subprocess.run([str(ROOT / "tests/pulsar/broker.sh"), cmd], check=True, capture_output=True)


def outage(d, secs):
    """The same profile while the broker is away (everything spools), then the drain after it."""
    pid = d.proc.pid
    broker_ctl("stop")
    d.wait_for(lambda s: not s["uplink"]["connected"], timeout=30, what="uplink down")
    s0, c0, t0 = d.status(), cpu_seconds(pid), time.time()
    time.sleep(secs)
    s1, c1, t1 = d.status(), cpu_seconds(pid), time.time()
    spooled = s1["spool"]
    tb = time.time()
    broker_ctl("start")  # returns once the broker answers; rigd reconnects on its next backoff step
    d.wait_for(lambda s: s["uplink"]["connected"], timeout=120, what="uplink back", interval=0.02)
    c2, t2 = cpu_seconds(pid), time.time()
    d.wait_for(lambda s: s["spool"]["records"] < 20, timeout=600, what="spool drained", interval=0.02)
    s3, c3, t3 = d.status(), cpu_seconds(pid), time.time()
    live_rate = sum(x["bytes"] for x in s1["sources"]) - sum(x["bytes"] for x in s0["sources"])
    live_rate /= (t1 - t0)
    drain_rate = spooled["bytes"] / max(t3 - t2, 1e-3)
    rows = {}
    rows["outage window (broker stopped)"] = f"{t1 - t0:.0f} s"
    rows["rigd CPU during the outage (spooling everything)"] = f"{100 * (c1 - c0) / (t1 - t0):.1f} %"
    rows["spooled at the end of the outage"] = f"{spooled['records']} records, {spooled['bytes'] / 1e6:.0f} MB"
    rows["broker start command to uplink connected"] = f"{t2 - tb:.1f} s"
    rows["drain after reconnect (capture going on)"] = (f"{t3 - t2:.2f} s, {drain_rate / 1e6:.0f} MB/s "
                                                        f"= {drain_rate / max(live_rate, 1):.1f}x the capture rate")
    rows["rigd CPU during the drain"] = f"{100 * (c3 - c2) / max(t3 - t2, 1e-3):.1f} %"
    rows["rigd peak RSS after outage and drain (VmHWM; the drain fills the 64 MiB in-flight window)"] = \
        f"{status_kb(pid, 'VmHWM') / 1024:.1f} MiB"
    rows["frames dropped by the spool"] = str(s3["spool"]["dropped"])
    return rows


if __name__ == "__main__":
    main()
