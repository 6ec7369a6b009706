#!/usr/bin/env python3
"""The H.264 stream the camera guest's passthrough check writes into v4l2loopback, made on the host
by FFmpeg's libx264 (through PyAV) and cut into the buffers a UVC H.264 camera would hand over.

    tests/vm/h264_clip.py OUT_DIR      exit 0, or 77 when PyAV or libx264 is missing (check skipped)

The clip: FFmpeg's `testsrc2` pattern, 640x360 at 30 fps, 60 frames, x264 `veryfast` CRF 30, an IDR
every 15 frames, no B-frames, scene cuts off, and global headers: the SPS and PPS come once, as the
encoder's extradata, and no packet carries them (a camera that sends its parameter sets once).
Each packet is one access unit (Annex B, as x264 writes it; two slices per picture).

OUT_DIR/sets.bin     the SPS and PPS (extradata)
OUT_DIR/feed/NNNN.bin one buffer each, written in name order with one write() per buffer:
    0      the SPS/PPS          written before the reader streams (it may never see it)
    1, 2   P-frames 3 and 4     before any keyframe: undecodable, dropped
    3      the SPS/PPS          in a buffer of their own: kept, not a frame
    ...    AUs 0..20            IDRs 0 and 15 without SPS/PPS: rigd inserts them
    ...    a buffer of text     no start code: rejected; the P-frames 21..29 after it are dropped
    ...    AUs 21..44           IDR 30 gets its SPS/PPS inserted
    ...    SPS/PPS + AU 45      a camera repeating its headers: passed untouched
    ...    AUs 46..59
OUT_DIR/clip.json    the feed's roles and each packet's size, IDR flag and FNV-1a 64
"""

from __future__ import annotations

import json
import sys
from fractions import Fraction
from pathlib import Path

WIDTH, HEIGHT, FPS, FRAMES, GOP = 640, 360, 30, 60, 15
GARBAGE = b"rigd: this buffer is not H.264, it has no start code. " * 4


def fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def nal_types(au: bytes) -> list[int]:
    out, i = [], 0
    while True:
        i = au.find(b"\x00\x00\x01", i)
        if i < 0 or i + 3 >= len(au):
            return out
        out.append(au[i + 3] & 0x1F)
        i += 3


def encode() -> tuple[bytes, list[bytes]]:
    import av

    src = av.open(f"testsrc2=size={WIDTH}x{HEIGHT}:rate={FPS}", format="lavfi")
    enc = av.CodecContext.create("libx264", "w")
    enc.width, enc.height, enc.pix_fmt = WIDTH, HEIGHT, "yuv420p"
    enc.time_base = Fraction(1, FPS)
    enc.framerate = Fraction(FPS, 1)
    enc.gop_size = GOP
    enc.max_b_frames = 0
    enc.flags |= av.codec.context.Flags.global_header
    enc.options = {"preset": "veryfast", "crf": "30", "sc_threshold": "0"}
    packets = []
    for i, frame in enumerate(src.decode(video=0)):
        if i == FRAMES:
            break
        frame = frame.reformat(format="yuv420p")
        frame.pts = i
        # lavfi marks its frames as I pictures, which x264 would honour: every frame an IDR.
        frame.pict_type = av.video.frame.PictureType.NONE
        packets += [bytes(p) for p in enc.encode(frame)]
    packets += [bytes(p) for p in enc.encode(None)]
    src.close()
    return bytes(enc.extradata), packets


def main() -> int:
    out = Path(sys.argv[1])
    try:
        import av  # noqa: F401

        sets, packets = encode()
    except Exception as e:  # PyAV missing, or built without libx264/lavfi
        print(f"h264_clip: cannot encode with PyAV's libx264: {e}", file=sys.stderr)
        return 77
    assert len(packets) == FRAMES, len(packets)
    assert sorted(set(nal_types(sets))) == [7, 8], nal_types(sets)
    idr = [5 in nal_types(p) for p in packets]
    assert [i for i, k in enumerate(idr) if k] == list(range(0, FRAMES, GOP)), idr
    assert not any(t in (7, 8) for p in packets for t in nal_types(p)), "packets carry no SPS/PPS"
    assert GARBAGE.find(b"\x00\x00\x01") < 0

    feed: list[tuple[str, int | None, bytes]] = [
        ("sets-before-reader", None, sets),
        ("au", 3, packets[3]),
        ("au", 4, packets[4]),
        ("sets", None, sets),
    ]
    feed += [("au", i, packets[i]) for i in range(0, 21)]
    feed.append(("garbage", None, GARBAGE))
    feed += [("au", i, packets[i]) for i in range(21, 45)]
    feed.append(("sets+au", 45, sets + packets[45]))
    feed += [("au", i, packets[i]) for i in range(46, FRAMES)]

    (out / "feed").mkdir(parents=True, exist_ok=True)
    for old in (out / "feed").glob("*.bin"):
        old.unlink()
    (out / "sets.bin").write_bytes(sets)
    for n, (_, _, data) in enumerate(feed):
        (out / "feed" / f"{n:04d}.bin").write_bytes(data)
    (out / "clip.json").write_text(json.dumps({
        "width": WIDTH, "height": HEIGHT, "fps": FPS, "gop": GOP,
        "sets_fnv": f"{fnv1a(sets):016x}",
        "packets": [{"idr": k, "len": len(p), "fnv": f"{fnv1a(p):016x}"} for p, k in zip(packets, idr)],
        "feed": [{"role": role, "au": au, "len": len(data)} for role, au, data in feed],
    }, indent=1))
    total = sum(len(p) for p in packets)
    print(f"h264_clip: {len(packets)} access units ({sum(idr)} IDR), {total} bytes, "
          f"{len(feed)} buffers to write", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
