"""Issue 46.5 for recall (docs/RECALL.md, "Exactly once"): a request killed -9 mid-upload resumes
under the same producer names, and what it sent after its last checkpoint must not go out again
when the broker keeps no deduplication state. Here deduplication is off on the namespace and the
on-request camera shares its `{modality}` topic with a live camera, so the topic's last entry is
almost never the request's: before the fix the resumed request's probe read that last entry, found
the live camera's, gave up and sent everything since the checkpoint again. Now it reads the topic
forward from the request name's last recorded receipt. Judged by the official client against the
stopped rig's spool: each frame of the range on the topic once."""

import time

import pulsar

from harness import BROKER_URL, Rigd, consume, namespace_without_dedup, unique
from test_recall_requests import S, Operator, first_held, spool_frames


def config(ns: str, rig: str) -> str:
    return f"""
[rig]
id = "{rig}"

[[source]]
id = "cam"
kind = "synthetic-camera"
width = 160
height = 120
fps = 20
frame-bytes = 200000
upload = "on-request"
retain-age = "10m"

[[source]]
id = "front"
kind = "synthetic-camera"
width = 160
height = 120
fps = 10

[pulsar]
url = "{BROKER_URL}"
topic = "persistent://{ns}/{{rig}}-{{modality}}"
max-bandwidth = "16mbit"

[spool]
path = "spool"

[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""



def test_a_recall_killed_mid_upload_on_a_shared_topic_without_dedup_sends_each_frame_once(broker, tmp_path):
    ns = namespace_without_dedup(unique("rshared"))
    rig = unique("rs")
    d = Rigd(tmp_path, config(ns, rig))
    op = Operator(ns, rig)
    try:
        d.start()
        d.wait_for(lambda s: s["uplink"]["connected"], timeout=60, what="uplink connected")
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
        # Half a second past the checkpoint: frames sent since are in no sent record.
        time.sleep(0.5)
        d.kill9()
        d.start()
        done = op.wait(rid, timeout=90)
        assert done["state"] == "done", done
        assert d.stop() == 0
        log = d.log()
    finally:
        d.close()
        op.close()
    held = spool_frames(tmp_path, frm, to, tmp_path / "out")
    msgs = consume(BROKER_URL, [f"persistent://{ns}/{rig}-camera"], idle_timeout_s=4,
                   consumer_type=pulsar.ConsumerType.Exclusive)
    assert any(m["properties"].get("recall") is None for m in msgs), "the premise: the live camera shares the topic"
    seqs = [int(m["properties"]["seq"]) for m in msgs if m["properties"].get("recall") == rid]
    dups = len(seqs) - len(set(seqs))
    print(f"{len(seqs)} recalled, {len(set(seqs))} seqs, {dups} twice, {len(held)} held in the range")
    assert dups == 0, f"{dups} frames arrived twice"
    assert set(seqs) == set(held), sorted(set(seqs) ^ set(held))[:10]
    restart = log.split("rigd running")[-1]
    assert "read the topic forward from this producer's last recorded receipt" in restart, restart[-3000:]
