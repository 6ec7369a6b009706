"""A thin budget and large frames keep their connection (issue 31.2): under `max-bandwidth`, chunks
and the write-ahead hold a few seconds of the rate, so one SEND never outlasts the broker's
keepalive (a PING every 30 s; no command back before the next tick closes the connection) and a
PONG is never queued behind a minute of frame bytes. rigd's own budget, no tc: the shared broker.
The official Python client judges what arrived."""

import pulsar

from harness import BROKER_URL, Rigd, consume, namespace_with_dedup, unique, check_synthetic_jpeg
from test_encryption import fleet_key

FRAME = 2_000_000  # 80 s of a 200 kbit/s budget: before, one SEND; the broker closed it every time


def test_2_mb_frames_under_a_200_kbit_budget_arrive_without_a_reconnect(tmp_path):
    ns = namespace_with_dedup(unique("keepalive"))
    rig = unique("ka")
    config = f"""
[rig]
id = "{rig}"

[[source]]
id = "cam"
kind = "synthetic-camera"
width = 160
height = 120
fps = 0.5
frame-bytes = {FRAME}

[pulsar]
url = "{BROKER_URL}"
topic = "persistent://{ns}/{{rig}}-{{source}}"
max-bandwidth = "200kbit"

[spool]
path = "spool"

[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""
    # The first frame takes ~85 s of the budget: at least two keepalive ticks of the broker.
    published_without_a_reconnect(tmp_path, config, f"persistent://{ns}/{rig}-cam", FRAME, timeout=200,
                                  what="the first 2 MB frame published under the budget")


def test_sealed_frames_drained_under_a_100_kbit_budget_arrive_without_a_reconnect(tmp_path):
    """With end-to-end encryption a spooled frame is sealed in pieces that cannot be cut again, one
    SEND each: under a budget a piece holds what the budget sends in a few seconds (before, 1 MiB:
    84 s at 100 kbit/s, and the broker closed the connection at its keepalive tick). `always` mode
    sends every frame from the spool, so every frame is sealed; the official consumer decrypts."""
    pub, priv = fleet_key(tmp_path)
    ns = namespace_with_dedup(unique("keepalive-sealed"))
    rig = unique("kas")
    size = 1_200_000  # before: a 1 MiB piece and a 150 kB one
    config = f"""
[rig]
id = "{rig}"

[[source]]
id = "cam"
kind = "synthetic-camera"
width = 160
height = 120
fps = 0.2
frame-bytes = {size}

[pulsar]
url = "{BROKER_URL}"
topic = "persistent://{ns}/{{rig}}-{{source}}"
max-bandwidth = "100kbit"
encryption-key-file = "{pub}"
encryption-key-name = "fleet-2026"

[spool]
path = "spool"
mode = "always"

[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""
    # The first frame takes ~100 s of the budget: three keepalive ticks of the broker.
    published_without_a_reconnect(tmp_path, config, f"persistent://{ns}/{rig}-cam", size, timeout=240,
                                  what="the first sealed 1.2 MB frame published under the budget",
                                  crypto_key_reader=pulsar.CryptoKeyReader(str(pub), str(priv)))


def published_without_a_reconnect(tmp_path, config, topic, size, timeout, what, crypto_key_reader=None):
    """Runs the rig until its first frame is published, with no reconnect and no "uplink down" on
    the way; the official client then finds every frame once, in order, whole."""
    d = Rigd(tmp_path, config).start()
    try:
        s = d.wait_for(lambda s: s["uplink"]["connected"], timeout=60, what="uplink connected")
        reconnects = s["uplink"]["reconnects"]
        s = d.wait_for(lambda s: s["sources"][0]["published"] >= 1, timeout=timeout, what=what, interval=1)
        assert s["uplink"]["reconnects"] == reconnects, ("the broker closed the connection", s["uplink"])
        assert s["uplink"]["connected"], s["uplink"]
        assert d.stop() == 0
        log = d.log()
    finally:
        d.close()
    assert "uplink down" not in log, log[-3000:]
    extra = {"crypto_key_reader": crypto_key_reader} if crypto_key_reader else {}
    msgs = consume(BROKER_URL, [topic], idle_timeout_s=5, **extra)
    assert len(msgs) >= 1
    seqs = [int(m["properties"]["seq"]) for m in msgs]
    assert seqs == list(range(len(seqs))), seqs
    for m in msgs:
        assert m["payload_len"] == size
        check_synthetic_jpeg(m["payload"])
