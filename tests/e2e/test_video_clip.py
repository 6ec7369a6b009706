"""Issue 48's benchmark stand-in for an H.264 passthrough camera: `synthetic-camera` with `clip =
FILE` hands over the access units of an H.264 file, nothing encoded (docs/PERFORMANCE.md "Video
(H.264)"). Judged by FFmpeg's own encoder and decoder: a libx264 stream (its SPS and PPS taken out
of every IDR but the first, as a camera that sends them once) goes in; what the rig spooled comes out through `rigd replay
--out`, and PyAV (libavcodec) cuts it into pictures and decodes every group alone from its keyframe."""

import json
import shutil
import subprocess

import av
import pytest

from harness import rigd_bin, unique
from test_video import spool_three_seconds

GOP = 10  # buckets: a group every 330 ms, shorter than the clip's own (15 frames, 500 ms)


def packets(data: bytes):
    """The access units of an Annex B stream as FFmpeg's h264 parser cuts them."""
    parser = av.CodecContext.create("h264", "r")
    return parser.parse(data) + parser.parse(b"")


def nal_types(au: bytes) -> list[int]:
    return [au[i + 3] & 0x1F for i in range(len(au) - 3) if au[i:i + 3] == b"\x00\x00\x01"]


def without_parameter_sets(au: bytes) -> bytes:
    """The access unit without its SPS and PPS (as a camera that sends them once leaves them out)."""
    starts = [i for i in range(len(au) - 3) if au[i:i + 3] == b"\x00\x00\x01"]
    starts = [i - 1 if i > 0 and au[i - 1] == 0 else i for i in starts]
    nals = [au[a:b] for a, b in zip(starts, starts[1:] + [len(au)])]
    return b"".join(n for n in nals if nal_types(n)[0] not in (7, 8))


def test_a_clip_camera_hands_over_the_files_pictures_each_group_opening_at_a_keyframe(tmp_path):
    if shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg (tests/setup.sh installs it)")
    clip = tmp_path / "clip.h264"
    subprocess.run(["ffmpeg", "-hide_banner", "-loglevel", "error", "-f", "lavfi", "-i",
                    "testsrc=size=320x240:rate=30", "-frames:v", "45", "-c:v", "libx264", "-preset",
                    "ultrafast", "-bf", "0", "-g", "15", "-keyint_min", "15", "-sc_threshold", "0",
                    "-f", "h264", str(clip)], check=True, timeout=60)
    source = [bytes(p) for p in packets(clip.read_bytes())]
    assert len(source) == 45
    # SPS and PPS before the first IDR only (libx264 repeats them: taken out here).
    source = source[:1] + [without_parameter_sets(au) for au in source[1:]]
    clip.write_bytes(b"".join(source))
    assert [7 in nal_types(au) for au in source] == [True] + [False] * 44
    cfg = f"""
[rig]
id = "{unique("vidclip")}"

[[source]]
id = "cam"
kind = "synthetic-camera"
codec = "h264"
clip = "{clip}"
width = 320
height = 240
fps = 30
gop = {GOP}

[spool]
path = "spool"

[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""
    spool, held = spool_three_seconds(tmp_path, cfg)  # 3 s of the clip into the spool (no broker)
    out = tmp_path / "files"
    r = subprocess.run([rigd_bin(), "replay", "--spool", str(spool), "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    times = [json.loads(line) for line in (out / "cam.timestamps.ndjson").read_text().splitlines()]
    units = packets((out / "cam.h264").read_bytes())
    assert len(units) == len(times) == held, (len(units), len(times), held)

    # The keyframe flag rigd sent is the picture's own, and keyframes open groups and only groups
    # (the clip's 15-frame groups are longer than the rig's 10 buckets).
    assert [u.is_keyframe for u in units] == [t["keyframe"] for t in times]
    firsts = [i == 0 or times[i]["bucket"] // GOP != times[i - 1]["bucket"] // GOP for i in range(len(times))]
    assert [t["keyframe"] for t in times] == firsts
    # Passed through: every picture that is not a keyframe is byte for byte one of the file's; a
    # keyframe carries the SPS and PPS (the file has them before its first IDR only).
    for u, t in zip(units, times):
        if t["keyframe"]:
            types = nal_types(bytes(u))
            assert 7 in types and 8 in types and 5 in types, types
        else:
            assert bytes(u) in source
    # Every group decodes alone, from its keyframe, with a decoder of its own.
    starts = [i for i, t in enumerate(times) if t["keyframe"]] + [len(units)]
    assert len(starts) > 4
    for a, b in zip(starts, starts[1:]):
        decoder = av.CodecContext.create("h264", "r")
        pictures = [f for u in units[a:b] for f in decoder.decode(u)] + list(decoder.decode(None))
        assert len(pictures) == b - a, (a, b, len(pictures))
        assert all((p.width, p.height) == (320, 240) for p in pictures)
