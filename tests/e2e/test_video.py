"""Issue 48: H.264 from the synthetic camera to Key_Shared consumers of partitioned topics, judged by
the consumers' own decoder (PyAV, FFmpeg's libavcodec), never by rigd's encoder read back.

A rig with a video source keys every message of every modality by its group (the first bucket of
the span of `gop` buckets holding the frame): a GOP lands on one partition and one consumer, and a
consumer that received a group decodes it alone, from its keyframe (docs/DRIVERS.md "H.264")."""

import collections
import threading
import time

import av
import pulsar

from harness import BROKER_URL, Rigd, admin, assert_once_each, namespace_with_dedup, unique

GOP = 10  # buckets of 33 ms: a group is 330 ms, about 10 frames at 30 fps
WIDTH, HEIGHT = 320, 240
PARTITIONS = 3


def config(rig: str, template: str) -> str:
    return f"""
[rig]
id = "{rig}"

[[source]]
id = "cam"
kind = "synthetic-camera"
codec = "h264"
width = {WIDTH}
height = {HEIGHT}
fps = 30
bitrate = "600kbit"
gop = {GOP}

[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 20

[pulsar]
url = "{BROKER_URL}"
topic = "{template}"

[spool]
path = "spool"

[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""


def nal_types(au: bytes) -> list[int]:
    """The NAL unit types of an Annex B access unit (5 IDR, 1 slice, 7 SPS, 8 PPS)."""
    out, i = [], 0
    while i + 3 < len(au):
        if au[i] == 0 and au[i + 1] == 0 and au[i + 2] == 1:
            out.append(au[i + 3] & 0x1F)
            i += 3
        else:
            i += 1
    return out


def spool_three_seconds(tmp_path, cfg: str):
    """rigd with `cfg` (no broker) for 3 s, stopped; the spool holds every frame of `cam` it
    counted (`spool stat`, at least 60). Returns the spool's path and that count."""
    import json
    import subprocess

    from harness import rigd_bin

    d = Rigd(tmp_path, cfg).start()
    try:
        time.sleep(3)
        assert d.stop() == 0
        totals = d.totals()
    finally:
        d.close()
    spool = tmp_path / "spool"
    stat = subprocess.run([rigd_bin(), "spool", "stat", "--spool", str(spool), "--json"],
                          capture_output=True, text=True, timeout=60)
    assert stat.returncode == 0, stat.stderr
    held = {s["id"]: s["records"] for s in json.loads(stat.stdout)["sources"]}
    assert held["cam"] == totals["cam"]["frames"] >= 60, (held, totals)
    return spool, held["cam"]


def decode_group(frames: list[bytes]) -> list:
    """A fresh decoder for one group, fed its access units in order: the decoded pictures."""
    ctx = av.CodecContext.create("h264", "r")
    pictures = []
    for data in frames:
        pictures.extend(ctx.decode(av.Packet(data)))
    pictures.extend(ctx.decode(None))
    return pictures


def test_three_key_shared_consumers_each_decode_every_group_they_receive_from_its_keyframe(broker, tmp_path):
    ns = namespace_with_dedup(unique("video"))
    rig = unique("vid")
    topics = {}
    for source in ("cam", "gps"):
        admin("PUT", f"/admin/v2/persistent/{ns}/{rig}-{source}/partitions", PARTITIONS)
        topics[source] = f"persistent://{ns}/{rig}-{source}"
    client = pulsar.Client(BROKER_URL, log_conf_file_path=None)
    ranges = [(0, 21844), (21845, 43690), (43691, 65535)]
    consumers = [
        client.subscribe(list(topics.values()), "video", consumer_type=pulsar.ConsumerType.KeyShared,
                         initial_position=pulsar.InitialPosition.Earliest, consumer_name=f"c{i}",
                         key_shared_policy=pulsar.ConsumerKeySharedPolicy(
                             pulsar.KeySharedMode.Sticky, sticky_ranges=[ranges[i]]))
        for i in range(3)
    ]
    received = {i: [] for i in range(3)}
    stop = threading.Event()

    def pump(i, c):
        while not stop.is_set():
            try:
                m = c.receive(timeout_millis=200)
            except pulsar.Timeout:
                continue
            received[i].append((m.topic_name(), m.partition_key(), m.properties(), m.data()))
            c.acknowledge(m)

    threads = [threading.Thread(target=pump, args=(i, c), daemon=True) for i, c in enumerate(consumers)]
    for th in threads:
        th.start()
    d = Rigd(tmp_path, config(rig, f"persistent://{ns}/{{rig}}-{{source}}")).start()
    try:
        d.wait_for(lambda s: all(x["published"] >= 30 for x in s["sources"]), timeout=60, what="publishing")
        time.sleep(5)  # the scenario: ~15 groups of video and their GPS sentences
        assert d.stop() == 0
        totals = d.totals()
    finally:
        d.close()
        deadline, last = time.time() + 30, -1
        while time.time() < deadline:  # until the consumers have gone quiet
            n = sum(len(v) for v in received.values())
            if n == last:
                break
            last = n
            time.sleep(2)
        stop.set()
        for th in threads:
            th.join()
        client.close()

    # Every captured frame arrived once: what rigd says it captured and published, the consumers hold.
    cam = [(i, t, k, p, data) for i, msgs in received.items() for (t, k, p, data) in msgs if p["source"] == "cam"]
    seqs = [int(p["seq"]) for (_, _, _, p, _) in cam]
    assert_once_each(seqs, "cam")
    assert totals["cam"]["frames"] == totals["cam"]["published"] == len(cam), (totals, len(cam))
    # A synthetic camera whose thread ran later than a frame interval skips that frame, as a
    # device's driver would (counted `device_drops`: 1 of 201 in a loaded fresh-clone run); the
    # encoder codes what was captured, so every group still decodes whole below.
    print(f"cam: {totals['cam']['frames']} frames, {totals['cam']['device_drops']} skipped by a late capture thread")

    # Every message of the rig, of either modality, is keyed by its group; the bucket stays exact.
    owner: dict[str, set] = collections.defaultdict(set)
    partitions: dict[str, set] = collections.defaultdict(set)
    for i, msgs in received.items():
        for topic, key, p, _ in msgs:
            bucket = int(p["bucket"])
            assert key == p["group"] == str(bucket // GOP * GOP), (key, p)
            owner[key].add(i)
            partitions[(p["source"], key)].add(topic.rsplit("-partition-", 1)[1])
    split = {k: v for k, v in owner.items() if len(v) > 1}
    assert not split, f"groups split across consumers: {list(split.items())[:5]}"
    assert not {k: v for k, v in partitions.items() if len(v) > 1}, "a group on two partitions"
    assert len({min(v) for v in owner.values()}) >= 2, "every group went to one consumer: nothing was shared"

    # Each consumer decodes each of its groups alone, from the group's keyframe: every frame.
    groups: dict[tuple, list] = collections.defaultdict(list)
    for i, _, key, p, data in cam:
        assert p["content-type"] == "video/h264" and p["codec"] == "h264", p
        assert (int(p["width"]), int(p["height"])) == (WIDTH, HEIGHT), p
        groups[(i, key)].append((int(p["seq"]), p["keyframe"] == "true", data))
    assert len(groups) >= 10, f"only {len(groups)} groups"
    decoded = 0
    lumas = []
    for (i, key), frames in sorted(groups.items()):
        frames.sort()
        keyflags = [k for _, k, _ in frames]
        assert keyflags[0] and not any(keyflags[1:]), f"group {key}: keyframes at {keyflags}"
        first = nal_types(frames[0][2])
        assert 7 in first and 8 in first and 5 in first, f"group {key}: keyframe NAL types {first}"
        assert all(5 not in nal_types(f[2]) for f in frames[1:]), f"group {key}: an IDR inside the group"
        pictures = decode_group([f[2] for f in frames])
        assert len(pictures) == len(frames), f"consumer {i} group {key}: {len(pictures)} of {len(frames)} decoded"
        assert all((p.width, p.height) == (WIDTH, HEIGHT) for p in pictures)
        decoded += len(pictures)
        lumas.append(pictures[0].to_ndarray(format="gray"))
    assert decoded == len(cam)
    # Real video: texture in every picture, and the picture moves from group to group.
    assert all(y.std() > 20 for y in lumas), [round(float(y.std()), 1) for y in lumas]
    assert abs(lumas[0].astype(int) - lumas[-1].astype(int)).mean() > 5
    per_group = len(cam) / len(groups)
    print(f"{len(cam)} frames in {len(groups)} groups ({per_group:.1f} a group) over "
          f"{len({min(v) for v in owner.values()})} consumers; {decoded} decoded by PyAV {av.__version__}")


def test_an_h264_camera_exports_to_mcap_as_compressed_video_that_pyav_decodes(tmp_path):
    """Issue 48.5: a spooled H.264 camera exported with `rigd replay --mcap` is a channel of
    `foxglove.CompressedVideo` (format h264) whose embedded descriptor agrees with Foxglove's own
    (PyPI foxglove-schemas-protobuf); the official MCAP reader decodes every message and PyAV every
    frame, from the first keyframe; `rigd replay --out` writes `cam.h264` that FFmpeg's own h264
    demuxer plays whole, with one timestamp line per frame; every count is what `rigd spool stat`
    holds."""
    import json
    import subprocess

    import mcap_protobuf.decoder as mcap_protobuf
    from foxglove_schemas_protobuf.CompressedVideo_pb2 import CompressedVideo
    from google.protobuf import descriptor_pb2
    from mcap.reader import make_reader

    from harness import rigd_bin

    rig = unique("vidmcap")
    cfg = config(rig, "unused").replace(f'[pulsar]\nurl = "{BROKER_URL}"\ntopic = "unused"\n', "")
    assert "[pulsar]" not in cfg
    spool, held = spool_three_seconds(tmp_path, cfg)
    path = tmp_path / "video.mcap"
    r = subprocess.run([rigd_bin(), "replay", "--spool", str(spool), "--mcap", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr

    with open(path, "rb") as f:
        reader = make_reader(f, decoder_factories=[mcap_protobuf.DecoderFactory()])
        video = [(schema, m, msg) for schema, ch, m, msg in reader.iter_decoded_messages(topics=["/cam"])]
    assert len(video) == held
    schema = video[0][0]
    assert schema.name == "foxglove.CompressedVideo"
    fds = descriptor_pb2.FileDescriptorSet.FromString(schema.data)
    ours = next(m for f in fds.file if f.package == "foxglove" for m in f.message_type)
    theirs = descriptor_pb2.DescriptorProto()
    CompressedVideo.DESCRIPTOR.CopyToProto(theirs)
    assert sorted((f.name, f.number, f.type) for f in ours.field) == \
        sorted((f.name, f.number, f.type) for f in theirs.field)
    assert all(msg.format == "h264" and msg.frame_id == "cam" for _, _, msg in video)
    first = nal_types(video[0][2].data)
    assert 7 in first and 8 in first and 5 in first, first
    pictures = decode_group([msg.data for _, _, msg in video])
    assert len(pictures) == len(video)
    assert all((p.width, p.height) == (WIDTH, HEIGHT) for p in pictures)

    # `replay --out`: the camera as one H.264 stream that FFmpeg's demuxer plays, and its timestamps.
    out = tmp_path / "files"
    r = subprocess.run([rigd_bin(), "replay", "--spool", str(spool), "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    times = [json.loads(line) for line in (out / "cam.timestamps.ndjson").read_text().splitlines()]
    assert len(times) == held and times[0]["keyframe"], times[:2]
    assert [t["seq"] for t in times] == sorted(t["seq"] for t in times)
    with av.open(str(out / "cam.h264"), format="h264") as container:
        played = list(container.decode(video=0))
    assert len(played) == held, (len(played), held)


def test_live_view_clients_joining_mid_group_start_at_a_keyframe_and_decode_everything(tmp_path):
    """Issue 48.4/48.5: Foxglove's own client (@foxglove/ws-protocol, tests/web/live_client.mjs)
    subscribes to the H.264 camera's live channel at three moments a third of a group apart: at
    most one of them can fall on a keyframe, yet each receives a keyframe (SPS, PPS, IDR) first,
    and one PyAV decoder per client decodes every frame it received, in order. Before, a client
    joining mid-group got P-frames it could not decode until the next keyframe."""
    import base64
    import json
    import subprocess
    from pathlib import Path

    client = Path(__file__).resolve().parents[1] / "web" / "live_client.mjs"
    rig = unique("vidlive")
    cfg = config(rig, "unused").replace(f'[pulsar]\nurl = "{BROKER_URL}"\ntopic = "unused"\n', "")
    cfg = cfg.replace(f"gop = {GOP}", "gop = 30")  # a group of about 1 s
    d = Rigd(tmp_path, cfg).start()
    try:
        time.sleep(1.5)
        runs = []
        for k in range(3):
            runs.append(subprocess.Popen(["node", str(client), f"ws://127.0.0.1:{d.port}/foxglove",
                                          "--subscribe", "/cam", "--seconds", "2.5"],
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            time.sleep(0.33)
        reports = []
        for r in runs:
            out, err = r.communicate(timeout=60)
            assert r.returncode == 0 and out.strip(), err[-2000:]
            reports.append(json.loads(out))
        assert d.stop() == 0
    finally:
        d.close()
    for n, rep in enumerate(reports):
        msgs = [m for m in rep["messages"] if m["topic"] == "/cam"]
        assert len(msgs) >= 30, f"client {n}: {len(msgs)} frames in 2.5 s"
        assert all(m.get("format") == "h264" for m in msgs), msgs[0]
        aus = [base64.b64decode(m["data"]) for m in msgs]
        first = nal_types(aus[0])
        assert 7 in first and 8 in first and 5 in first, f"client {n} started on NAL types {first}"
        pictures = decode_group(aus)
        assert len(pictures) == len(aus), f"client {n}: {len(pictures)} of {len(aus)} decoded"
        assert (pictures[0].width, pictures[0].height) == (WIDTH, HEIGHT)
        print(f"client {n}: {len(aus)} frames, first NAL types {first}, all decoded")


def test_the_status_page_still_of_an_h264_camera_is_its_last_keyframe_as_ffmpeg_decodes_it(tmp_path):
    """Issue 48.5: an H.264 camera's preview on the status page. rigd keeps each keyframe (no
    decoder runs per frame) and decodes the last one into a JPEG when a page asks. Judged against
    FFmpeg's decoder: the still served for seq N matches PyAV's picture of frame N of the spool's
    own export (luma PSNR), and is not the picture of the other keyframe fetched a second later."""
    import io
    import json
    import subprocess
    import urllib.request

    import numpy
    from PIL import Image

    from harness import rigd_bin

    rig = unique("vidstill")
    cfg = config(rig, "unused").replace(f'[pulsar]\nurl = "{BROKER_URL}"\ntopic = "unused"\n', "")
    cfg = cfg.replace(f"gop = {GOP}", "gop = 30")  # a keyframe about every second
    d = Rigd(tmp_path, cfg).start()
    stills = {}
    try:
        cam = lambda s: next(x for x in s["sources"] if x["id"] == "cam")  # noqa: E731
        for _ in range(2):
            seen = set(stills)
            st = d.wait_for(lambda s: cam(s)["preview_seq"] is not None and cam(s)["preview_seq"] not in seen,
                            timeout=15, what="a new keyframe on the status page")
            with urllib.request.urlopen(d.url("/api/sources/cam/preview.jpg"), timeout=10) as r:
                assert r.headers["Content-Type"] == "image/jpeg"
                seq = int(r.headers["X-Frame-Seq"])
                stills[seq] = r.read()
            assert seq >= cam(st)["preview_seq"], (seq, cam(st)["preview_seq"])
        assert d.stop() == 0
    finally:
        d.close()
    assert len(stills) == 2, stills.keys()
    out = tmp_path / "out"
    r = subprocess.run([rigd_bin(), "replay", "--spool", str(tmp_path / "spool"), "--source", "cam",
                        "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in (out / "cam.timestamps.ndjson").read_text().splitlines()]
    index = {x["seq"]: i for i, x in enumerate(lines)}
    with av.open(str(out / "cam.h264"), format="h264") as f:
        pictures = [p for p in f.decode(video=0)]
    assert len(pictures) == len(lines), (len(pictures), len(lines))

    def luma_of_picture(p) -> numpy.ndarray:
        plane = p.planes[0]
        rows = numpy.frombuffer(bytes(plane), numpy.uint8).reshape(p.height, plane.line_size)
        return rows[:, :p.width].astype(float)

    def psnr(a: numpy.ndarray, b: numpy.ndarray) -> float:
        mse = float(((a - b) ** 2).mean())
        return 10 * numpy.log10(255.0 ** 2 / max(mse, 1e-9))

    seqs = sorted(stills)
    for seq in seqs:
        assert seq in index and lines[index[seq]]["keyframe"], f"the still's seq {seq} is not a keyframe"
    for seq, other in (seqs, seqs[::-1]):
        img = Image.open(io.BytesIO(stills[seq]))
        assert img.size == (WIDTH, HEIGHT), img.size
        luma = numpy.asarray(img.convert("YCbCr"))[:, :, 0].astype(float)
        own = psnr(luma, luma_of_picture(pictures[index[seq]]))
        theirs = psnr(luma, luma_of_picture(pictures[index[other]]))
        print(f"still of seq {seq}: {own:.1f} dB against PyAV's frame {seq}, {theirs:.1f} dB against {other}")
        assert own > 30.0, own
        assert own > theirs + 3.0, (own, theirs)
