"""Recall on request (docs/RECALL.md, issue 27): requests on the rig's control topic, answers on
`{control-topic}-status`, exactly the requested range uploaded once. The operator's side is the
official Python client (and `rigd recall` in one test); what arrived is judged by the official
client against the spool itself, read after the rig stopped with `rigd replay --out`."""

import contextlib
import json
import re
import subprocess
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pulsar

from harness import (BROKER_URL, LoopbackQdisc, Rigd, assert_once_each, check_synthetic_jpeg, consume,
                     namespace_with_dedup, received_seqs, rigd_bin, unique)

S = 1_000_000_000


def config(ns: str, rig: str, *, fps=20, frame_bytes=20000, retain='retain-age = "10m"', pulsar_extra="",
           web_extra="") -> str:
    return f"""
[rig]
id = "{rig}"

[[source]]
id = "cam"
kind = "synthetic-camera"
width = 160
height = 120
fps = {fps}
frame-bytes = {frame_bytes}
upload = "on-request"
{retain}

[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 20

[pulsar]
url = "{BROKER_URL}"
topic = "persistent://{ns}/{{rig}}-{{source}}"
{pulsar_extra}

[spool]
path = "spool"

[web]
bind = "127.0.0.1:{{WEB_PORT}}"
{web_extra}
"""


class Operator:
    """The fleet side with the official client: requests to the control topic, answers read from
    the status topic (subscribed before anything is sent)."""

    def __init__(self, ns: str, rig: str):
        self.control = f"persistent://{ns}/{rig}-control"
        self.client = pulsar.Client(BROKER_URL, operation_timeout_seconds=30,
                                    logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
        self.answers = self.client.subscribe(f"{self.control}-status", f"op-{uuid.uuid4().hex[:8]}",
                                             consumer_type=pulsar.ConsumerType.Exclusive,
                                             initial_position=pulsar.InitialPosition.Earliest)
        self.producer = self.client.create_producer(self.control, block_if_queue_full=True,
                                                    batching_enabled=False)
        self.seen: list[dict] = []

    def send(self, body) -> None:
        self.producer.send(body if isinstance(body, bytes) else json.dumps(body).encode())

    def upload(self, frm: int, to: int, sources=("cam",), rid=None, force=False) -> str:
        rid = rid or str(uuid.uuid4())
        self.send({"op": "upload", "id": rid, "sources": list(sources), "from": frm, "to": to, "force": force})
        return rid

    def read(self, timeout_s: float) -> dict | None:
        try:
            m = self.answers.receive(timeout_millis=int(timeout_s * 1000))
        except pulsar.Timeout:
            return None
        self.answers.acknowledge(m)
        a = json.loads(m.data())
        assert m.partition_key() == a["id"], "answers are keyed by the request id"
        self.seen.append(a)
        return a

    def wait(self, rid: str, states=("done", "partial", "rejected", "cancelled", "coverage"), timeout=60) -> dict:
        for a in self.seen:
            if a["id"] == rid and a["state"] in states:
                return a
        deadline = time.time() + timeout
        while time.time() < deadline:
            a = self.read(max(0.1, deadline - time.time()))
            if a and a["id"] == rid and a["state"] in states:
                return a
        raise AssertionError(f"no {states} answer for {rid} in {timeout} s; seen: {self.seen[-5:]}")

    def coverage(self) -> dict:
        rid = str(uuid.uuid4())
        self.send({"op": "coverage", "id": rid})
        return {h["source"]: h for h in self.wait(rid, ("coverage",), timeout=30)["sources"]}

    def close(self):
        self.client.close()


def recalled(ns: str, rig: str) -> list[dict]:
    return consume(BROKER_URL, [f"persistent://{ns}/{rig}-cam"], idle_timeout_s=4,
                   consumer_type=pulsar.ConsumerType.Exclusive)


def spool_frames(workdir: Path, frm: int, to: int, out: Path) -> dict[int, bytes]:
    """seq -> JPEG of every camera frame the (stopped) rig's spool holds in [frm, to)."""
    r = subprocess.run([rigd_bin(), "replay", "--spool", str(workdir / "spool"), "--source", "cam",
                        "--from", str(frm), "--to", str(to), "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    frames = {}
    for f in (out / "cam").glob("*.jpg"):
        capture, seq = f.stem.split("-")
        assert frm <= int(capture) < to
        frames[int(seq)] = f.read_bytes()
    return frames


@contextlib.contextmanager
def running(tmp_path: Path, prefix: str, **cfg):
    """A rig (`config(**cfg)`) in a namespace of its own with deduplication, started and its uplink
    connected, and its operator; the rig is killed if the test did not stop it."""
    ns = namespace_with_dedup(unique("recall"))
    rig = unique(prefix)
    d = Rigd(tmp_path, config(ns, rig, **cfg))
    op = Operator(ns, rig)
    try:
        d.start()
        d.wait_for(lambda s: s["uplink"]["connected"], timeout=60, what="uplink connected")
        yield ns, rig, d, op
    finally:
        d.close()
        op.close()


def first_held(op: Operator) -> int:
    return op.coverage()["cam"]["held"][0]["from"]


def test_an_exact_range_is_uploaded_once_and_repeats_and_overlaps_add_nothing(broker, tmp_path):
    with running(tmp_path, "rq") as (ns, rig, d, op):
        time.sleep(14)
        t0 = first_held(op)
        # Nothing of the on-request camera was published live.
        assert recalled(ns, rig) == []
        # Test 2: [t0+4 s, t0+8 s) through `rigd recall --wait --json` (the operator's CLI).
        a_from, a_to = t0 + 4 * S, t0 + 8 * S
        started = time.time()
        cli = subprocess.run([rigd_bin(), "recall", "--pulsar", BROKER_URL, "--rig", rig,
                              "--control-topic", f"persistent://{ns}/{{rig}}-control", "--source", "cam",
                              "--from", str(a_from), "--to", str(a_to), "--wait", "--json", "--timeout", "60"],
                             capture_output=True, text=True, timeout=90)
        assert cli.returncode == 0, cli.stderr[-3000:]
        answers = [json.loads(line) for line in cli.stdout.splitlines()]
        assert answers[0]["state"] == "accepted" and answers[-1]["state"] == "done", answers
        assert time.time() - started < 30
        first = answers[-1]
        assert first["sent"]["frames"] == first["total"]["frames"] > 60, first
        rid1 = first["id"]
        # Test 3: the same range again under a new id: done, nothing sent.
        rid2 = op.upload(a_from, a_to)
        again = op.wait(rid2)
        assert again["state"] == "done" and again["sent"]["frames"] == 0, again
        assert again["already_sent"] == first["total"]["frames"], again
        # The same id again: its own final answer, nothing sent.
        op.upload(a_from, a_to, rid=rid2)
        # An overlapping [t0+6 s, t0+10 s): only [t0+8 s, t0+10 s) goes.
        rid3 = op.upload(t0 + 6 * S, t0 + 10 * S)
        over = op.wait(rid3)
        assert over["state"] == "done", over
        assert 0 < over["sent"]["frames"] < over["total"]["frames"], over
        # `force`: the first range again, on purpose, all of it.
        rid4 = op.upload(a_from, a_to, force=True)
        forced = op.wait(rid4)
        assert forced["state"] == "done" and forced["sent"]["frames"] == first["total"]["frames"], forced
        assert d.stop() == 0
    got = recalled(ns, rig)
    by_id: dict[str, list[dict]] = {}
    for m in got:
        by_id.setdefault(m["properties"].get("recall"), []).append(m)
    assert set(by_id) == {rid1, rid3, rid4}, f"only the requests that had frames to send: {set(by_id)}"
    held1 = spool_frames(tmp_path, a_from, a_to, tmp_path / "r1")
    held3 = spool_frames(tmp_path, a_to, t0 + 10 * S, tmp_path / "r3")
    for rid, held in ((rid1, held1), (rid3, held3), (rid4, held1)):
        seqs = [int(m["properties"]["seq"]) for m in by_id[rid]]
        assert len(seqs) == len(set(seqs)), f"{rid}: duplicates"
        assert set(seqs) == set(held), f"{rid}: {sorted(set(seqs) ^ set(held))[:10]} differ from the spool"
        for m in by_id[rid]:
            assert m["payload"] == held[int(m["properties"]["seq"])], "payload byte-identical to the spool's"
            assert m["key"] == m["properties"]["bucket"]
    assert len(held1) == first["sent"]["frames"]
    assert_once_each(received_seqs(f"persistent://{ns}/{rig}-gps"), "gps")


def test_a_range_no_longer_held_is_answered_partial(broker, tmp_path):
    with running(tmp_path, "rp", retain='retain-age = "5s"') as (ns, rig, d, op):
        start_ns = time.time_ns()
        time.sleep(10)
        held_from = first_held(op)
        assert held_from > start_ns + 3 * S, "the retention evicted the first seconds"
        rid = op.upload(start_ns, held_from + 2 * S)
        a = op.wait(rid)
        assert a["state"] == "partial", a
        (missing,) = a["missing"]
        assert missing["source"] == "cam"
        (span,) = missing["evicted"]
        assert span["from"] == start_ns and held_from - 1 * S <= span["to"] <= held_from, (span, held_from)
        assert a["sent"]["frames"] > 0, "what is still held is sent"
        metrics = d.get("/metrics").decode()
        m = re.search(r'rigd_retention_evicted_total\{[^}]*source="cam"[^}]*\} (\d+)', metrics)
        assert m and int(m.group(1)) > 0
        assert d.stop() == 0
    got = recalled(ns, rig)
    assert got and all(held_from <= int(m["properties"]["capture-ns"]) < held_from + 2 * S for m in got)


def test_kill9_mid_upload_then_restart_leaves_the_range_once(broker, tmp_path):
    """Under a 2 MiB/s budget a 24 MB range takes ~12 s: kill -9 once it is under way, restart,
    and the topic holds each frame of the range once (the sent record and broker dedup)."""
    with running(tmp_path, "rk", fps=20, frame_bytes=200_000,
                 pulsar_extra='max-bandwidth = "16mbit"') as (ns, rig, d, op):
        time.sleep(9)
        t0 = first_held(op)
        frm, to = t0 + 1 * S, t0 + 7 * S
        rid = op.upload(frm, to)
        op.wait(rid, ("accepted",), timeout=30)
        deadline = time.time() + 60
        while time.time() < deadline:
            a = op.read(5)
            if a and a["id"] == rid and a["state"] == "progress" and a["sent"]["frames"] >= 10:
                break
        else:
            raise AssertionError(f"no progress; {op.seen[-3:]}")
        assert a["sent"]["frames"] < a["total"]["frames"], "killed mid-upload"
        d.kill9()
        d.start()
        done = op.wait(rid, timeout=90)
        assert done["state"] == "done", done
        assert d.stop() == 0
    held = spool_frames(tmp_path, frm, to, tmp_path / "out")
    seqs = [int(m["properties"]["seq"]) for m in recalled(ns, rig)]
    dups = len(seqs) - len(set(seqs))
    assert dups == 0, f"{dups} frames arrived twice"
    assert set(seqs) == set(held), sorted(set(seqs) ^ set(held))[:10]


class RigCut(LoopbackQdisc):
    """A silent link for one process: its TCP connections' packets on loopback go into a class of
    8 bit/s (nothing passes, nothing is reset), new connections included while the cut lasts (a
    thread follows them with `ss`). The broker and other tests' traffic are untouched."""

    def __init__(self, pid: int):
        self.pid = pid
        self.ports: set[int] = set()
        self.stop = threading.Event()

    def rig_ports(self) -> set[int]:
        out = subprocess.run(["ss", "-Htnp"], capture_output=True, text=True).stdout
        ports = set()
        for line in out.splitlines():
            if f"pid={self.pid}," in line:
                local = line.split()[3]
                ports.add(int(local.rsplit(":", 1)[1]))
        return ports

    def follow(self):
        while not self.stop.wait(0.1):
            for p in self.rig_ports() - self.ports:
                self.add_filter("sport", p)
                self.add_filter("dport", p)
                self.ports.add(p)

    def install(self):
        self.add_class("rate", "8bit", "ceil", "8bit", "burst", "1", "cburst", "1", leaf_limit=1)
        self.follow_thread = threading.Thread(target=self.follow, daemon=True)
        self.follow_thread.start()

    def remove(self):
        self.stop.set()
        self.follow_thread.join()
        super().remove()


def test_a_request_sent_during_a_cut_completes_after_the_link_returns(broker, tmp_path):
    with running(tmp_path, "rc") as (ns, rig, d, op):
        time.sleep(6)
        t0 = first_held(op)
        with RigCut(d.proc.pid):
            time.sleep(1)
            rid = op.upload(t0 + 1 * S, t0 + 4 * S)
            time.sleep(8)
            assert not [a for a in op.seen if a["id"] == rid] and op.read(1) is None, \
                "the rig cannot have read it"
        done = op.wait(rid, timeout=90)
        assert done["state"] == "done" and done["sent"]["frames"] > 0, done
        assert d.stop() == 0
    held = spool_frames(tmp_path, t0 + 1 * S, t0 + 4 * S, tmp_path / "out")
    seqs = [int(m["properties"]["seq"]) for m in recalled(ns, rig)]
    assert sorted(seqs) == sorted(held)
    assert_once_each(received_seqs(f"persistent://{ns}/{rig}-gps"), "gps")


def test_bad_requests_are_rejected_with_the_reason_and_the_rig_goes_on(broker, tmp_path):
    with running(tmp_path, "rb") as (ns, rig, d, op):
        now = time.time_ns()
        cases = {
            "malformed": b'{"op": "upload", "id": "m1", ',
            "unknown op": {"op": "explode", "id": "u1"},
            "unknown source": {"op": "upload", "id": "s1", "sources": ["rear"], "from": now - S, "to": now},
            "live source": {"op": "upload", "id": "l1", "sources": ["gps"], "from": now - S, "to": now},
            "from >= to": {"op": "upload", "id": "r1", "from": now, "to": now},
            "over 24 h": {"op": "upload", "id": "d1", "from": now - 25 * 3600 * S, "to": now},
        }
        for body in cases.values():
            op.send(body)
        for rid, why in (("u1", "explode"), ("s1", "rear"), ("l1", "live"), ("r1", "before"), ("d1", "24 h")):
            a = op.wait(rid, ("rejected",), timeout=30)
            assert why in a["reason"], a
        assert any(a["state"] == "rejected" and "malformed" in a["reason"] for a in op.seen), op.seen
        # 64 pending (ranges open for an hour), the 65th refused.
        for i in range(64):
            op.upload(now, now + 3600 * S, rid=f"p{i}")
        op.upload(now, now + 3600 * S, rid="p64")
        a = op.wait("p64", ("rejected", "accepted"), timeout=60)
        assert a["state"] == "rejected" and "pending" in a["reason"], a
        # A flood: every message answered, with bounded work each.
        for i in range(10_000):
            op.producer.send_async(b"garbage %d" % i, None)
        op.producer.flush()
        rejected = 0
        deadline = time.time() + 120
        while rejected < 10_000 and time.time() < deadline:
            a = op.read(10)
            if a and a["state"] == "rejected" and "malformed" in a.get("reason", ""):
                rejected += 1
        assert rejected == 10_000, f"{rejected} of 10,000 answered"
        metrics = d.get("/metrics").decode()
        m = re.search(r'rigd_recall_rejected_total\{reason="malformed"\} (\d+)', metrics)
        assert m and int(m.group(1)) >= 10_001, metrics[-3000:]
        s = d.status()
        assert s["recall"]["pending"] == 64, s["recall"]
        assert d.stop() == 0
    assert_once_each(received_seqs(f"persistent://{ns}/{rig}-gps"), "gps")


def test_a_marker_uploads_exactly_the_window_around_it(broker, tmp_path):
    """A technician's marker with 5 s before and 5 s after (POST /api/events): the window
    [mark - 5 s, mark + 5 s) of the on-request camera arrives, exactly the spool's frames of it,
    the part after the marker as it is captured."""
    (tmp_path / "web.token").write_text("tok-recall-0123456789\n")
    with running(tmp_path, "rm", web_extra=f'token-file = "{tmp_path / "web.token"}"') as (ns, rig, d, op):
        d.wait_for(lambda s: s.get("recall", {}).get("connected"), timeout=60, what="recall connected")
        time.sleep(7)
        req = urllib.request.Request(d.url("/api/events"), method="POST", data=json.dumps(
            {"note": "hard brake", "upload": {"before_s": 5, "after_s": 5}}).encode(),
            headers={"Authorization": "Bearer tok-recall-0123456789", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 201
            marked = json.loads(r.read())
        rid, mark = marked["upload_request"], marked["capture_ns"]
        assert op.wait(rid, ("accepted",), timeout=30)
        done = op.wait(rid, timeout=60)
        assert done["state"] == "done" and done["sent"]["frames"] > 150, done
        assert d.stop() == 0
    held = spool_frames(tmp_path, mark - 5 * S, mark + 5 * S, tmp_path / "out")
    got = [m for m in recalled(ns, rig) if m["properties"].get("recall") == rid]
    seqs = [int(m["properties"]["seq"]) for m in got]
    assert len(seqs) == len(set(seqs)) and set(seqs) == set(held), sorted(set(seqs) ^ set(held))[:10]
    assert len(held) >= 190, "10 s at 20 fps"


def test_with_encryption_a_recalled_range_is_as_encrypted_as_live(broker, tmp_path):
    """End-to-end encryption on: the spool holds the on-request camera's frames sealed, and the
    recalled range reaches the topic as live frames do: the official consumer with the fleet's
    private key decrypts every frame to its JPEG, one without it gets nothing."""
    from test_encryption import fleet_key
    pub, priv = fleet_key(tmp_path)
    keys = f'encryption-key-file = "{pub}"\nencryption-key-name = "fleet-2026"'
    with running(tmp_path, "re", pulsar_extra=keys) as (ns, rig, d, op):
        time.sleep(6)
        t0 = first_held(op)
        rid = op.upload(t0 + 1 * S, t0 + 4 * S)
        done = op.wait(rid)
        # 3 s at 20 fps is 60 frames; a loaded host's synthetic camera captured 48 in one CI run
        # (the seqs below prove none of the range's frames is missing, whatever the count).
        assert done["state"] == "done" and done["sent"]["frames"] == done["total"]["frames"] >= 30, done
        assert d.stop() == 0
    topic = f"persistent://{ns}/{rig}-cam"
    plain = consume(BROKER_URL, [topic], idle_timeout_s=5, consumer_type=pulsar.ConsumerType.Exclusive,
                    crypto_key_reader=pulsar.CryptoKeyReader(str(pub), str(priv)))
    seqs = [int(m["properties"]["seq"]) for m in plain]
    assert len(seqs) == len(set(seqs)) == done["sent"]["frames"], (len(seqs), done)
    # The camera numbers every frame it captures: the range's frames are one unbroken run of seqs.
    assert max(seqs) - min(seqs) + 1 == len(seqs), sorted(seqs)
    for m in plain:
        assert m["properties"]["recall"] == rid
        check_synthetic_jpeg(m["payload"])
        assert t0 + 1 * S <= int(m["properties"]["capture-ns"]) < t0 + 4 * S
    assert consume(BROKER_URL, [topic], idle_timeout_s=4) == [], "nothing for a consumer without the key"


def test_requests_batched_and_compressed_by_the_official_client_are_each_answered(broker, tmp_path):
    """The rig reads its control topic on its own connection (issue 46: through the pool, not the
    pulsar crate): what the official client sends batched and compressed (LZ4, ZSTD) is unpacked,
    every request answered (4 batches of 10 with LZ4, more than the reader's 16 permits; 3 batches
    of 50 with ZSTD, each larger than them: the broker's count goes below zero and the rig's flow
    must cover the debt, which it did not, so it read nothing after the first such batch); ZLIB,
    which rigd does not read, is counted unreadable and the rig goes on."""
    with running(tmp_path, "rpack", fps=5) as (ns, rig, d, op):
        sent = []
        for codec, size, n in ((pulsar.CompressionType.LZ4, 10, 40), (pulsar.CompressionType.ZSTD, 50, 150)):
            p = op.client.create_producer(op.control, batching_enabled=True, batching_max_messages=size,
                                          batching_max_publish_delay_ms=200, compression_type=codec)
            ids = [str(uuid.uuid4()) for _ in range(n)]
            # Batches, each compressed as a whole: more messages than the reader's permits
            # (the broker charges a batch one permit per message).
            for k in range(0, len(ids), size):
                for rid in ids[k:k + size]:
                    p.send_async(json.dumps({"op": "coverage", "id": rid}).encode(), None)
                p.flush()
            p.close()
            sent += ids
        for rid in sent:
            assert op.wait(rid, ("coverage",), timeout=30)["sources"], rid
        z = op.client.create_producer(op.control, batching_enabled=False,
                                      compression_type=pulsar.CompressionType.ZLib)
        z.send(json.dumps({"op": "coverage", "id": "zlib"}).encode())
        z.close()
        after = str(uuid.uuid4())
        op.send({"op": "coverage", "id": after})
        op.wait(after, ("coverage",), timeout=30)
        metrics = d.get("/metrics").decode()
        assert 'rigd_recall_rejected_total{reason="unreadable"} 1' in metrics, metrics[-3000:]
        assert "compressed with ZLIB" in d.log()
        assert not any(a["id"] == "zlib" for a in op.seen)
        assert d.stop() == 0
