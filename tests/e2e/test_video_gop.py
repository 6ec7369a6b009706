"""Issue 48.4: a group of pictures is never cut where frames are dropped or a range is cut out,
judged by the consumer's own decoder (PyAV) and the official Python pulsar-client.

- A small spool with `when-full = "drop-oldest"` and no broker for a while (the broker's port is a
  loopback forwarder that is not listening yet), then the link back: every group that arrives
  starts at its keyframe, has no hole, and PyAV decodes every frame of it from that keyframe.
- `rigd replay --from` a P-frame's capture time writes from that group's keyframe and says so."""

import collections
import json
import socket
import subprocess
import threading
import time
from urllib.parse import urlparse

import av
import pulsar

from harness import BROKER_URL, Rigd, assert_once_each, consume, free_port, namespace_with_dedup, rigd_bin, unique
from test_video import decode_group, nal_types

GOP = 10


def config(rig: str, url: str | None, topic: str = "", spool: str = "") -> str:
    pulsar_section = f'\n[pulsar]\nurl = "{url}"\ntopic = "{topic}"\n' if url else ""
    return f"""
[rig]
id = "{rig}"

[[source]]
id = "cam"
kind = "synthetic-camera"
codec = "h264"
width = 320
height = 240
fps = 30
bitrate = "4000kbit"
gop = {GOP}
{pulsar_section}
[spool]
path = "spool"
{spool}

[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""


class Forwarder:
    """A loopback TCP port that forwards to the broker once `open()` is called (before: refused)."""

    def __init__(self, port: int, target: tuple[str, int]):
        self.port, self.target, self.stop = port, target, threading.Event()

    def open(self):
        self.srv = socket.create_server(("127.0.0.1", self.port))
        self.srv.settimeout(0.2)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stop.is_set():
            try:
                c, _ = self.srv.accept()
            except socket.timeout:
                continue
            except OSError:
                return  # closed
            u = socket.create_connection(self.target)
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.stop.set()
        if hasattr(self, "srv"):
            self.srv.close()


def test_a_full_spool_dropping_the_oldest_then_the_link_back_delivers_only_whole_decodable_groups(broker, tmp_path):
    ns = namespace_with_dedup(unique("gop"))
    rig = unique("gop")
    topic = f"persistent://{ns}/{rig}-cam"
    b = urlparse(BROKER_URL)
    fwd = Forwarder(free_port(), (b.hostname, b.port or 6650))
    client = pulsar.Client(BROKER_URL, log_conf_file_path=None)
    consumer = client.subscribe(topic, "gop", consumer_type=pulsar.ConsumerType.Exclusive,
                                initial_position=pulsar.InitialPosition.Earliest)
    d = Rigd(tmp_path, config(rig, f"pulsar://127.0.0.1:{fwd.port}", f"persistent://{ns}/{{rig}}-{{source}}",
                              'max-bytes = "2MiB"\nwhen-full = "drop-oldest"'))
    d.start()
    try:
        # ~500 kB/s into a 2 MiB spool (1 MiB segments) for 14 s: drop-oldest drops many times over.
        time.sleep(14)
        fwd.open()
        # rigd's reconnect backoff grew over 14 s of refusals (capped at 10 s): the first frame
        # may come several seconds after the port opens (a CI run's flake at quiet_s=3 from open).
        msgs = receive_until_quiet(consumer, quiet_s=3, limit_s=40, wait_first=True)
        assert d.stop() == 0
        totals = d.totals()
    finally:
        d.close()
        fwd.close()
        client.close()
    log = d.log()
    assert "dropped the oldest segment" in log, "the spool never filled: the test proves nothing"
    cam = totals["cam"]
    print("totals", cam, "received", len(msgs))
    assert cam["spool_dropped"] > 0, cam
    groups, decoded, whole, _ = check_groups(msgs)
    print(f"{len(msgs)} frames in {groups} groups arrived, {whole} whole, {decoded} decoded; "
          f"spool dropped {cam['spool_dropped']}")
    assert decoded == len(msgs) > 0
    assert whole > 0


def test_replay_from_a_p_frame_starts_at_its_groups_keyframe(tmp_path):
    d = Rigd(tmp_path, config(unique("gop"), None))
    d.start()
    try:
        time.sleep(3)
        assert d.stop() == 0
    finally:
        d.close()
    spool = tmp_path / "spool"

    def replay(out, *extra):
        return subprocess.run([rigd_bin(), "replay", "--spool", str(spool), "--source", "cam", "--out", str(out),
                               *extra], capture_output=True, text=True, timeout=60)

    r = replay(tmp_path / "all")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in (tmp_path / "all" / "cam.timestamps.ndjson").read_text().splitlines()]
    assert len(lines) > 3 * GOP, len(lines)
    keys = [i for i, x in enumerate(lines) if x["keyframe"]]
    # A P-frame in the middle of the second group.
    mid = keys[1] + 4
    assert not lines[mid]["keyframe"]
    r = replay(tmp_path / "cut", "--from", str(lines[mid]["capture_ns"]))
    assert r.returncode == 0, r.stderr
    assert "keyframe" in r.stderr and "cam" in r.stderr, r.stderr
    cut = [json.loads(x) for x in (tmp_path / "cut" / "cam.timestamps.ndjson").read_text().splitlines()]
    assert cut[0]["seq"] == lines[keys[1]]["seq"] and cut[0]["keyframe"], (cut[0], lines[keys[1]])
    assert len(cut) == len(lines) - keys[1]
    # ffmpeg's decoder reads the file from its first byte: every access unit decodes.
    with av.open(str(tmp_path / "cut" / "cam.h264"), format="h264") as f:
        n = sum(1 for _ in f.decode(video=0))
    assert n == len(cut), (n, len(cut))
    print(f"--from seq {lines[mid]['seq']} extended to keyframe seq {cut[0]['seq']}; {n} frames decoded")


def test_a_recall_starting_inside_a_group_is_sent_from_its_keyframe_and_says_so(broker, tmp_path):
    """Issue 48.4: a recall whose range starts on a P-frame extends back to its group's keyframe,
    names it in the answer (`from_keyframe`), and what arrives (official client) decodes from its
    first frame. Three requests start 100 ms apart within a 330 ms group: a start that falls on a
    keyframe is a 33 ms window per group, so at most one of them can, and at least two extend."""
    from test_recall_requests import S, Operator, first_held

    ns = namespace_with_dedup(unique("vrecall"))
    rig = unique("vrec")
    cfg = config(rig, BROKER_URL, f"persistent://{ns}/{{rig}}-{{source}}").replace(
        f"gop = {GOP}\n", f'gop = {GOP}\nupload = "on-request"\nretain-age = "10m"\n')
    d = Rigd(tmp_path, cfg)
    op = Operator(ns, rig)
    try:
        d.start()
        d.wait_for(lambda s: s["uplink"]["connected"], timeout=60, what="uplink connected")
        time.sleep(4)
        t0 = first_held(op) + 1 * S
        asked = {}
        for k in range(3):
            frm = t0 + k * 100_000_000
            asked[op.upload(frm, frm + 2 * S, force=True)] = frm
        answers = {rid: op.wait(rid, timeout=60) for rid in asked}
        assert d.stop() == 0
    finally:
        d.close()
        op.close()
    msgs = consume(BROKER_URL, [f"persistent://{ns}/{rig}-cam"], idle_timeout_s=4,
                   consumer_type=pulsar.ConsumerType.Exclusive)
    extended = 0
    for rid, frm in asked.items():
        a = answers[rid]
        assert a["state"] == "done", a
        got = sorted((int(m["properties"]["seq"]), m) for m in msgs if m["properties"].get("recall") == rid)
        assert got, f"{rid}: nothing recalled"
        aus = [m["payload"] for _, m in got]
        first_capture = int(got[0][1]["properties"]["capture-ns"])
        types = nal_types(aus[0])
        assert 5 in types and 7 in types, f"{rid} starts on NAL types {types}"
        starts = a.get("from_keyframe", [])
        if first_capture < frm:
            extended += 1
            assert starts == [{"source": "cam", "from": first_capture}], a
        else:
            assert starts == [], a
        assert len(decode_group(aus)) == len(aus), f"{rid}: not every frame decodes"
        seqs = [s for s, _ in got]
        assert seqs == list(range(seqs[0], seqs[-1] + 1)), f"{rid}: a hole in the range"
    print(f"{extended} of 3 ranges extended back to their keyframe")
    assert extended >= 2


def receive_until_quiet(consumer, quiet_s: int, limit_s: float, wait_first: bool = False) -> list:
    """(properties, data) of each message received, acknowledged, until `quiet_s` seconds pass
    without one or `limit_s` in all. `wait_first`: the quiet seconds count only from the first
    message (a rig reconnecting after a long outage waits out its backoff, up to 10 s, first)."""
    got, quiet, deadline = [], 0, time.time() + limit_s
    while time.time() < deadline and quiet < quiet_s:
        try:
            m = consumer.receive(timeout_millis=1000)
        except pulsar.Timeout:
            if got or not wait_first:
                quiet += 1
            continue
        quiet = 0
        got.append((m.properties(), m.data()))
        consumer.acknowledge(m)
    return got


def check_groups(msgs: list) -> tuple[int, int, int, int]:
    """Groups by their `group` key: each starts at its keyframe, has no hole and no repeat, and
    PyAV decodes every frame of it from that keyframe. Returns (groups, frames decoded, whole,
    closed): closed, the groups with a later keyframe received; whole, those of them that run up
    to it (nothing of them is still to come)."""
    groups: dict[str, list] = collections.defaultdict(list)
    for p, data in msgs:
        groups[p["group"]].append((int(p["seq"]), p["keyframe"] == "true", data))
    keyseqs = sorted(s for g in groups.values() for s, k, _ in g if k)
    decoded = whole = closed = 0
    for key, frames in groups.items():
        frames.sort()
        seqs = [s for s, _, _ in frames]
        assert len(set(seqs)) == len(seqs), f"group {key}: a frame twice"
        assert frames[0][1], f"group {key} arrived without its keyframe: seqs {seqs[:5]}..."
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"group {key}: a hole in {seqs}"
        assert 5 in nal_types(frames[0][2])
        pictures = decode_group([f[2] for f in frames])
        assert len(pictures) == len(frames), f"group {key}: {len(pictures)} of {len(frames)} decoded"
        decoded += len(pictures)
        later = [k for k in keyseqs if k > seqs[0]]
        closed += bool(later)
        whole += bool(later) and later[0] == seqs[-1] + 1
    return len(groups), decoded, whole, closed


def test_a_camera_above_the_budget_sends_decodable_groups_live_first_and_the_rest_after(broker, tmp_path):
    """Issue 48.4, the thin link: an H.264 camera at ~1.5 Mbit/s under `max-bandwidth = "600kbit"`
    cannot go live whole, so its lane spills and splits live-first, at keyframes. While the budget
    holds, every group the official client receives starts at its keyframe and decodes in order
    (a split cut inside a group would leave P-frames without their keyframe); after a restart
    without the budget, every frame arrives once and every group is whole and decodes."""
    ns = namespace_with_dedup(unique("gopthin"))
    rig = unique("gopthin")
    topic = f"persistent://{ns}/{rig}-cam"
    client = pulsar.Client(BROKER_URL, log_conf_file_path=None)
    consumer = client.subscribe(topic, "thin", consumer_type=pulsar.ConsumerType.Exclusive,
                                initial_position=pulsar.InitialPosition.Earliest)

    cfg = config(rig, BROKER_URL, f"persistent://{ns}/{{rig}}-{{source}}").replace(
        'bitrate = "4000kbit"', 'bitrate = "1500kbit"')
    thin = cfg.replace(f'topic = "persistent://{ns}/{{rig}}-{{source}}"\n',
                       f'topic = "persistent://{ns}/{{rig}}-{{source}}"\nmax-bandwidth = "600kbit"\n')
    assert thin != cfg
    d = Rigd(tmp_path, thin)
    try:
        d.start()
        early = receive_until_quiet(consumer, quiet_s=100, limit_s=12)
        assert d.stop() == 0
        first = d.totals()["cam"]
        d.config_path.write_text(cfg.replace("{WEB_PORT}", str(d.port)))
        d.start()
        # The first run's frames drained (live-first: beside the new ones), then the rest.
        late, seen = [], {int(p["seq"]) for p, _ in early}
        deadline = time.time() + 40
        while len(seen & set(range(first["frames"]))) < first["frames"] and time.time() < deadline:
            got = receive_until_quiet(consumer, quiet_s=1, limit_s=1)
            late += got
            seen |= {int(p["seq"]) for p, _ in got}
        assert d.stop() == 0
        late += receive_until_quiet(consumer, quiet_s=3, limit_s=30)
    finally:
        d.close()
        client.close()
    print(f"under the budget: {len(early)} of {first['frames']} frames in 12 s; "
          f"then {len(late)} after the restart without it")
    assert first["spooled"] > 0, f"the camera never waited behind the budget: {first}"
    assert 0 < len(early) < first["frames"], (len(early), first)
    groups, decoded, _, _ = check_groups(early)
    print(f"under the budget: {groups} groups, {decoded} frames decoded")
    everything = early + late
    assert_once_each([int(p["seq"]) for p, _ in everything], "cam")
    groups, decoded, whole, closed = check_groups(everything)
    assert decoded == len(everything)
    assert whole == closed, f"{closed - whole} groups arrived with frames missing at their end"
    print(f"in all: {groups} whole groups, {decoded} frames decoded")
