"""Recall, its first part (docs/RECALL.md): an `on-request` source is held on the rig, never
published live, within its retention (`retain-age`, `retain-bytes`), every eviction counted; the
live sources beside it publish as before. Judged by the official Python client and /metrics."""

import re
import time

import pulsar
import pytest

from harness import BROKER_URL, Rigd, assert_once_each, consume, namespace_with_dedup, unique


def config(ns: str, rig: str, retain: str) -> str:
    return f"""
[rig]
id = "{rig}"

[[source]]
id = "cam"
kind = "synthetic-camera"
width = 160
height = 120
fps = 20
frame-bytes = 50000
upload = "on-request"
{retain}

[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 50

[pulsar]
url = "{BROKER_URL}"
topic = "persistent://{ns}/{{rig}}-{{source}}"

[spool]
path = "spool"

[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""


@pytest.mark.parametrize("retain,bound", [('retain-age = "3s"', "age"), ('retain-bytes = "1MiB"', "bytes")])
def test_an_on_request_source_is_held_within_its_retention_and_never_published(broker, tmp_path, retain, bound):
    ns = namespace_with_dedup(unique("recall"))
    rig = unique("hold")
    d = Rigd(tmp_path, config(ns, rig, retain))
    try:
        d.start()
        d.wait_for(lambda s: s["uplink"]["connected"], timeout=60, what="uplink connected")
        time.sleep(8)
        s = d.status()
        cam = next(x for x in s["sources"] if x["id"] == "cam")
        assert cam["upload"] == "on-request"
        assert cam["published"] == 0
        assert cam["retention_evicted"] > 0, cam
        # Nothing silent: every frame captured is held, evicted by the retention, or counted.
        assert cam["spool_pushed"] == cam["spooled_records"] + cam["retention_evicted"] + cam["spool_dropped"], cam
        assert cam["frames"] >= cam["spool_pushed"] >= cam["frames"] - 5, cam
        if bound == "age":
            # 3 s, looked at once a second, plus the time to poll.
            assert cam["held_since_age_ms"] <= 5500, cam
            assert cam["spooled_records"] >= 40, cam
        else:
            # Looked at once a second: at most a second and a half of capture (~1 MB/s) above it;
            # without the retention 8 s would hold ~8 MB.
            assert cam["spool_bytes"] <= (1 << 20) + 1_600_000, cam
        metrics = d.get("/metrics").decode()
        m = re.search(r'rigd_retention_evicted_total\{[^}]*source="cam"[^}]*\} (\d+)', metrics)
        assert m and int(m.group(1)) > 0, metrics[-2000:]
        # The held frames are not a backlog: the live uplink is not waiting on them.
        assert s["uplink"]["connected"]
        assert d.stop() == 0
    finally:
        d.close()
    cam_msgs = consume(BROKER_URL, [f"persistent://{ns}/{rig}-cam"], idle_timeout_s=4,
                       consumer_type=pulsar.ConsumerType.Exclusive)
    assert cam_msgs == [], f"{len(cam_msgs)} frames of the on-request source were published"
    gps = consume(BROKER_URL, [f"persistent://{ns}/{rig}-gps"], idle_timeout_s=6,
                  consumer_type=pulsar.ConsumerType.Exclusive)
    assert_once_each([int(m["properties"]["seq"]) for m in gps], "gps")
    assert len(gps) >= 300


def test_retention_keys_are_checked(tmp_path):
    """`rigd check`: a retention on a live source, a unit it does not know, a control topic that is
    not the rig's own."""
    import subprocess
    from harness import rigd_bin
    for bad, says in [('retain-age = "2h"', "source[0].retain-age: only for upload = \"on-request\""),
                      ('upload = "on-request"\nretain-age = "2 weeks"', "source[0].retain-age:"),
                      ('upload = "sometimes"', "source[0].upload: unknown variant `sometimes`")]:
        p = tmp_path / "r.toml"
        p.write_text(f'[rig]\nid = "a"\n[[source]]\nid = "c"\nkind = "synthetic-camera"\n{bad}\n')
        r = subprocess.run([rigd_bin(), "check", "--config", str(p)], capture_output=True, text=True)
        assert r.returncode == 2, (bad, r.stdout, r.stderr)
        assert says in r.stdout + r.stderr, (bad, r.stdout, r.stderr)
    # The control topic: each rig its own ({rig}), no other placeholder.
    for topic, says in [("persistent://a/b/control", "must contain {rig}"),
                        ("persistent://a/b/{rig}-{source}", "the only placeholder is {rig}")]:
        p = tmp_path / "r.toml"
        p.write_text(f'[rig]\nid = "a"\n[[source]]\nid = "c"\nkind = "synthetic-camera"\n'
                     f'[pulsar]\ncontrol-topic = "{topic}"\n')
        r = subprocess.run([rigd_bin(), "check", "--config", str(p)], capture_output=True, text=True)
        assert r.returncode == 2 and f"pulsar.control-topic: {says}" in r.stdout + r.stderr, (topic, r.stdout, r.stderr)
