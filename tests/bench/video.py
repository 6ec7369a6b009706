#!/usr/bin/env python3
"""Video (issue 48's benchmark; docs/PERFORMANCE.md "Video (H.264)"), run by tests/bench/video.sh.

On the same frames (the synthetic camera's textured, noisy pan, 1080p30, written raw by
drivers/examples/video_bench.rs), side by side:
1. bytes/s of MJPEG (libturbojpeg, quality 80 as a raw camera's today) against H.264 (OpenH264 as
   rigd runs it) over a sweep of bitrates, SSIM (ffmpeg's `ssim` filter) of each decoded stream
   against the source frames (noise included) and against the scene without the noise; the
   bitrate whose SSIM against the source equals the MJPEG's is searched (log-linear between the
   sweep's points, then encoded and measured) and the byte ratio given there;
2. encoder CPU per frame (thread CPU time) against `ffmpeg -c:v libx264` (the anchor) on the
   same raw frames at the same bitrate: one thread, no B-frames, a keyframe every 30 frames;
   ffmpeg's CPU is the process's (user + sys) less a run that only reads the frames;
3. the rig profile (tests/bench/rig_profile.py: camera + 48 kHz audio + 100 Hz serial publishing
   live) with an H.264 passthrough camera (a clip of the encoded pan handed over, nothing
   encoded), with the camera encoded by rigd, and with the MJPEG camera as the reference.

    python3 tests/bench/video.py --bench target/release/examples/video_bench [--quick] \\
        [--frames 300] [--url pulsar://127.0.0.1:6650] [--profile-secs 60] [--keep DIR]"""

import argparse
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BITRATE = 2_000_000  # `bitrate`'s default (daemon/src/config/source.rs)


def log(msg):
    print(f"video: {msg}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, a, out):
        self.a, self.out = a, out
        self.size = f"{a.width}x{a.height}"
        self.raw = ["-f", "rawvideo", "-pix_fmt", "yuv420p", "-s", self.size, "-r", str(a.fps)]

    def encode(self, *args):
        """Runs video_bench with `args`; its JSON lines."""
        cmd = [str(self.a.bench), "--out", str(self.out), "--frames", str(self.a.frames),
               "--width", str(self.a.width), "--height", str(self.a.height), "--fps", str(self.a.fps),
               "--gop", str(self.a.gop), *args]
        p = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]

    def h264(self, bitrate):
        (row,) = self.encode("--no-source", "--no-mjpeg", "--bitrates", str(bitrate))
        return self.judge(row, ["-f", "h264"], "yuv420p")

    def ssim(self, file, demux, pix_fmt, reference):
        """SSIM (Y and all planes) of `file` decoded by ffmpeg against the raw `reference`. The
        decoded frames go through a pipe as raw samples (`pix_fmt` as decoded: yuvj420p for JPEG),
        so no range or format conversion sits between the two."""
        dec = subprocess.Popen(["ffmpeg", "-hide_banner", "-loglevel", "error", *demux, "-i", str(file),
                                "-f", "rawvideo", "-pix_fmt", pix_fmt, "-"],
                               stdout=subprocess.PIPE)
        cmp = subprocess.run(["ffmpeg", "-hide_banner", "-nostats", *self.raw, "-i", str(reference),
                              *self.raw, "-i", "pipe:0", "-lavfi", "[1:v][0:v]ssim", "-f", "null", "-"],
                             stdin=dec.stdout, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        dec.stdout.close()
        dec.wait()
        m = re.search(r"SSIM Y:([0-9.]+).*All:([0-9.]+)", cmp.stderr)
        frames = re.findall(r"frame=\s*(\d+)", cmp.stderr)
        if not m or dec.returncode != 0:
            raise RuntimeError(f"ssim of {file}: {cmp.stderr[-500:]}")
        if frames and int(frames[-1]) != self.a.frames:
            raise RuntimeError(f"ssim of {file}: {frames[-1]} frames compared, {self.a.frames} encoded")
        return float(m.group(1)), float(m.group(2))

    def judge(self, row, demux, pix_fmt):
        row["ssim_y"], row["ssim_all"] = self.ssim(row["file"], demux, pix_fmt, self.out / "source.yuv")
        row["scene_ssim_y"], _ = self.ssim(row["file"], demux, pix_fmt, self.out / "clean.yuv")
        return row

    def ffmpeg_cpu(self, args):
        """CPU seconds (user + sys) of one ffmpeg run over the raw frames."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", *self.raw,
                        "-i", str(self.out / "source.yuv"), *args], check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

    def x264(self, preset, bitrate, read_cpu):
        file = self.out / f"x264-{preset}-{bitrate}.h264"
        cpu = self.ffmpeg_cpu(["-c:v", "libx264", "-preset", preset, "-threads", "1", "-bf", "0",
                               "-g", str(self.a.gop), "-keyint_min", str(self.a.gop), "-sc_threshold", "0",
                               "-b:v", str(bitrate), "-f", "h264", str(file)])
        n = self.a.frames
        row = {"what": f"x264 {preset}", "file": str(file), "bitrate": bitrate,
               "bytes_per_s": file.stat().st_size / n * self.a.fps,
               "cpu_ms_per_frame": max(cpu - read_cpu, 0) * 1e3 / n}
        return self.judge(row, ["-f", "h264"], "yuv420p")


def equal_quality(b, sweep, target):
    """The bitrate at which OpenH264's SSIM (Y, against the source) meets `target`: log-linear
    between the sweep's points, then encoded and measured, two more steps at most (secant)."""
    pts = sorted(sweep, key=lambda r: r["bitrate"])
    tried = []
    for _ in range(3):
        above = [r for r in pts if r["ssim_y"] >= target]
        below = [r for r in pts if r["ssim_y"] < target]
        if not above or not below:
            return None, tried  # the sweep does not bracket it
        hi = min(above, key=lambda r: r["bitrate"])
        lo = max((r for r in below if r["bitrate"] < hi["bitrate"]), key=lambda r: r["bitrate"], default=None)
        if lo is None:
            return hi, tried
        t = (target - lo["ssim_y"]) / (hi["ssim_y"] - lo["ssim_y"])
        rate = math.exp(math.log(lo["bitrate"]) + t * (math.log(hi["bitrate"]) - math.log(lo["bitrate"])))
        rate = int(round(rate / 10_000) * 10_000)
        if rate in (lo["bitrate"], hi["bitrate"]) or any(r["bitrate"] == rate for r in pts):
            return hi, tried
        row = b.h264(rate)
        tried.append(row)
        pts = sorted(pts + [row], key=lambda r: r["bitrate"])
        if abs(row["ssim_y"] - target) < 0.0003:
            return row, tried
    return min((r for r in pts if r["ssim_y"] >= target), key=lambda r: r["bitrate"]), tried


def mb(bps):
    return f"{bps / 1e6:.2f} MB/s ({bps * 8 / 1e6:.1f} Mbit/s)"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", type=Path, required=True, help="drivers/examples/video_bench's binary")
    ap.add_argument("--quick", action="store_true", help="a tiny run that proves every step works")
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--height", type=int, default=1080)
    ap.add_argument("--fps", type=int, default=30)
    ap.add_argument("--gop", type=int, default=30)
    ap.add_argument("--quality", type=int, default=80, help="MJPEG quality (a raw camera's `jpeg-quality` default)")
    ap.add_argument("--sweep", default="1000000,2000000,4000000,8000000,16000000,32000000")
    ap.add_argument("--presets", default="veryfast,medium", help="libx264 presets of the anchor")
    ap.add_argument("--url", default=os.environ.get("PULSAR_URL", "pulsar://127.0.0.1:6650"))
    ap.add_argument("--profile-secs", type=float, default=60)
    ap.add_argument("--profiles", default="h264-clip,h264,mjpeg", help="rig_profile.py formats ('' skips)")
    ap.add_argument("--keep", type=Path, help="keep the frames and streams in this directory")
    a = ap.parse_args()
    if a.quick:
        a.frames, a.width, a.height = 10, 320, 192
        a.sweep, a.presets, a.profile_secs = "300000,1000000", "ultrafast", 1
        a.profiles = "h264-clip"
    sweep = [int(x) for x in a.sweep.split(",")]
    out = a.keep or Path(tempfile.mkdtemp(prefix="video-", dir=ROOT / "target"))
    out.mkdir(parents=True, exist_ok=True)
    try:
        run(a, Bench(a, out), sweep)
    finally:
        if not a.keep:
            shutil.rmtree(out, ignore_errors=True)


def run(a, b, sweep):
    t0 = time.time()
    ver = subprocess.run(["ffmpeg", "-version"], capture_output=True, text=True).stdout.split("\n")[0]
    print(f"{os.cpu_count()} cores, load {' '.join(open('/proc/loadavg').read().split()[:3])} at the start, "
          f"{time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}; {ver.split(' Copyright')[0]}; "
          f"{a.frames} frames of {a.width}x{a.height} at {a.fps} fps, a keyframe every {a.gop}")
    print()
    log(f"frames, MJPEG and OpenH264 at {sweep}")
    rows = b.encode("--clean", "--quality", str(a.quality), "--bitrates", ",".join(map(str, sweep)))
    by = {r["what"]: r for r in rows}
    mjpeg = b.judge(by["mjpeg"], ["-f", "mjpeg"], "yuvj420p")
    h264 = [b.judge(r, ["-f", "h264"], "yuv420p") for r in rows if r["what"] == "h264"]
    log("equal quality")
    eq, tried = equal_quality(b, h264, mjpeg["ssim_y"])
    h264 = sorted(h264 + tried, key=lambda r: r["bitrate"])

    print(f"### Bytes at equal quality: MJPEG (libturbojpeg, quality {a.quality}) against H.264 (OpenH264 as rigd runs it)")
    print()
    print("SSIM of the luma (ffmpeg `ssim`), against the source frames as the camera films them (sensor noise "
          "included) and against the scene without the noise. CPU: thread CPU time of the encode alone.")
    print()
    print("| encode | bytes/s | MJPEG / this | SSIM Y vs source | SSIM Y vs scene | CPU per frame |")
    print("|---|---|---|---|---|---|")
    print(f"| MJPEG q{a.quality} | {mb(mjpeg['bytes_per_s'])} | 1.0x | {mjpeg['ssim_y']:.4f} | "
          f"{mjpeg['scene_ssim_y']:.4f} | {mjpeg['cpu_ms_per_frame']:.1f} ms |")
    for r in h264:
        mark = " (equal quality)" if eq is r else ""
        print(f"| H.264 {r['bitrate'] / 1e6:g} Mbit/s{mark} | {mb(r['bytes_per_s'])} | "
              f"{mjpeg['bytes_per_s'] / r['bytes_per_s']:.1f}x | {r['ssim_y']:.4f} | {r['scene_ssim_y']:.4f} | "
              f"{r['cpu_ms_per_frame']:.1f} ms |")
    print()
    if eq:
        ratio = mjpeg["bytes_per_s"] / eq["bytes_per_s"]
        print(f"Equal quality against the source (SSIM Y {mjpeg['ssim_y']:.4f}): H.264 at "
              f"{eq['bitrate'] / 1e6:g} Mbit/s (SSIM {eq['ssim_y']:.4f}), **{ratio:.1f}x** smaller than MJPEG "
              f"(goal >= 5x: {'met' if ratio >= 5 else 'missed'}).")
    else:
        print(f"Equal quality against the source (SSIM Y {mjpeg['ssim_y']:.4f}): not bracketed by the sweep.")
    scene = [r for r in h264 if r["scene_ssim_y"] >= mjpeg["scene_ssim_y"]]
    if scene:
        s = min(scene, key=lambda r: r["bitrate"])
        print(f"Against the scene (SSIM Y {mjpeg['scene_ssim_y']:.4f} for MJPEG): H.264 from {s['bitrate'] / 1e6:g} "
              f"Mbit/s of the sweep ({s['scene_ssim_y']:.4f}), {mjpeg['bytes_per_s'] / s['bytes_per_s']:.1f}x smaller.")
    default = next((r for r in h264 if r["bitrate"] == DEFAULT_BITRATE), None)
    if default:
        print(f"The default bitrate (2 Mbit/s): SSIM Y {default['ssim_y']:.4f} against the source, "
              f"{default['scene_ssim_y']:.4f} against the scene, {mjpeg['bytes_per_s'] / default['bytes_per_s']:.1f}x "
              "smaller than MJPEG.")
    print()

    log("the libx264 anchor")
    read_cpu = b.ffmpeg_cpu(["-f", "null", "-"])
    rates = [DEFAULT_BITRATE if DEFAULT_BITRATE in sweep else sweep[0]]
    if eq and eq["bitrate"] not in rates:
        rates.append(eq["bitrate"])
    print("### Encoder CPU per frame at the same bitrate: OpenH264 (rigd) against `ffmpeg -c:v libx264` (the anchor)")
    print()
    print(f"Both one thread, no B-frames, a keyframe every {a.gop} frames, the same raw frames; libx264's CPU "
          f"is ffmpeg's user + sys less {read_cpu * 1e3 / a.frames:.1f} ms a frame for reading the frames "
          f"(`-f null`). ffmpeg: `-c:v libx264 -preset P -threads 1 -bf 0 -g {a.gop} -keyint_min {a.gop} "
          "-sc_threshold 0 -b:v RATE`.")
    print()
    print("| bitrate | encoder | bytes/s | SSIM Y vs source | SSIM Y vs scene | CPU per frame | / OpenH264 |")
    print("|---|---|---|---|---|---|---|")
    for rate in rates:
        ours = next(r for r in h264 if r["bitrate"] == rate)
        print(f"| {rate / 1e6:g} Mbit/s | OpenH264 (rigd) | {mb(ours['bytes_per_s'])} | {ours['ssim_y']:.4f} | "
              f"{ours['scene_ssim_y']:.4f} | {ours['cpu_ms_per_frame']:.1f} ms | 1.0x |")
        for preset in a.presets.split(","):
            log(f"libx264 {preset} at {rate}")
            x = b.x264(preset, rate, read_cpu)
            print(f"| {rate / 1e6:g} Mbit/s | libx264 {preset} | {mb(x['bytes_per_s'])} | {x['ssim_y']:.4f} | "
                  f"{x['scene_ssim_y']:.4f} | {x['cpu_ms_per_frame']:.1f} ms | "
                  f"{x['cpu_ms_per_frame'] / max(ours['cpu_ms_per_frame'], 1e-9):.1f}x |")
    print()
    log(f"encodes took {time.time() - t0:.0f} s")

    if a.profiles:
        log(f"rig profiles {a.profiles}")
        # The full run hands over its 1080p stream at the default bitrate; the smoke its small one
        # (the width and height the frames carry are the profile config's).
        clip = b.out / f"h264-{rates[0]}.h264"
        print(f"### Rig profile: 1080p30 camera + 48 kHz stereo + 100 Hz serial, publishing live "
              f"({a.profile_secs:g} s each, one after the other)")
        print()
        env = dict(os.environ)
        env.setdefault("RIGD_BIN", str(ROOT / "target/release/rigd"))
        subprocess.run([sys.executable, str(ROOT / "tests/bench/rig_profile.py"), "--secs", str(a.profile_secs),
                        "--outage-secs", "0", "--url", a.url, "--formats", a.profiles, "--clip", str(clip),
                        "--bitrate", f"{DEFAULT_BITRATE / 1e6:g}mbit"], check=True, env=env)
        print()
        print(f"The passthrough clip: {clip.stat().st_size / 1e6:.2f} MB ({a.frames} access units of the pan at "
              f"{rates[0] / 1e6:g} Mbit/s, {a.width}x{a.height}), held in memory and handed over in a loop.")
        print()


if __name__ == "__main__":
    main()
