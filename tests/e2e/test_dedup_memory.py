"""When the broker keeps no deduplication state for rigd's producer — deduplication off, or the
state forgotten after brokerDeduplicationProducerInactivityTimeoutMinutes (6 h by default: a vehicle
parked overnight) — a restart reads the topic's last message instead (docs/UPLINK.md, "Overnight
park"), so frames of the earlier run that the spool still holds but the broker already stored are
not sent twice. `always` mode with kill -9 leaves exactly such frames: acked, their removal not yet
committed. The official client counts every seq."""

import os
import subprocess
import time

import pulsar
import pytest

from harness import (BROKER_URL, ROOT, Rigd, admin, assert_once_each_in_order, consume, free_port, namespace_without_dedup, received_seqs,
                     unique)
from test_encryption import fleet_key

CONFIG = """
[rig]
id = "{rig}"

[[source]]
id = "cam"
kind = "synthetic-camera"
width = 160
height = 120
fps = 30

[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 100

[pulsar]
url = "{url}"
topic = "persistent://{ns}/{{rig}}-{{source}}"

[spool]
path = "spool"
mode = "always"
fsync-ms = 200

[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""


def assert_once_each(url, ns, rig):
    for source in ["cam", "gps"]:
        seqs = received_seqs(f"persistent://{ns}/{rig}-{source}", url=url)
        assert seqs, source
        assert_once_each_in_order(seqs, source)


def kill9_runs(d, secs):
    for s in secs:
        d.start()
        d.wait_for(lambda st: st["uplink"]["connected"] and st["uplink"]["published"] > 50, timeout=60,
                   what="publishing")
        time.sleep(s)
        d.kill9()



def test_without_broker_dedup_a_restart_does_not_resend_what_the_topic_holds(broker, tmp_path):
    ns = namespace_without_dedup(unique("nodedup"))
    rig = unique("probe")
    d = Rigd(tmp_path, CONFIG.format(rig=rig, url=BROKER_URL, ns=ns))
    try:
        kill9_runs(d, [2.1, 1.7, 2.6])
        d.start()
        d.wait_for(lambda s: s["uplink"]["connected"] and s["spool"]["records"] < 40, timeout=60, what="drained")
        assert d.stop() == 0
        assert "the topic's last message decides" in d.log()
    finally:
        d.close()
    assert_once_each(BROKER_URL, ns, rig)


# The last entry as the probe finds it: a serial line compressed then encrypted, or one
# lz4-compressed chunk of a 12 MiB frame (the synthetic frame stays above 5 MiB compressed).
# (`always` mode publishes from the spool, one frame per entry: no batches.)
PROBE_VARIANTS = {
    "encrypted-lz4": ("gps", """
[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 200
""", 'compression = "lz4"\nencryption-key-file = "{pub}"\nencryption-key-name = "fleet-2026"\n', 60),
    "lz4-chunks": ("cam", """
[[source]]
id = "cam"
kind = "synthetic-camera"
width = 320
height = 240
fps = 2
frame-bytes = 12582912
""", 'compression = "lz4"\n', 2),
}


@pytest.mark.parametrize("variant", sorted(PROBE_VARIANTS))
def test_the_probe_reads_an_encrypted_entry_or_a_compressed_chunk_as_the_last_entry(broker, tmp_path, variant):
    """Issue 31.4: the probe now reads the last entry's metadata alone, on a connection of its
    own protocol code, instead of the `pulsar` crate's consumer. An entry compressed then
    encrypted, and one lz4-compressed chunk of a 12 MiB frame (measured: the crate's consumer
    read these two as well; the case it could not, mutual TLS, is in test_encryption.py).
    Deduplication off, `always` mode, kill -9 twice: the probe decides, and every seq arrives
    once (the official client, decrypting with the fleet's private key)."""
    source, sources, extra, published = PROBE_VARIANTS[variant]
    pub, priv = fleet_key(tmp_path)
    ns = namespace_without_dedup(unique("nodedup"))
    rig = unique("probe")
    cfg = CONFIG.format(rig=rig, url=BROKER_URL, ns=ns)
    head, tail = cfg.split("[pulsar]", 1)
    cfg = head.split("[[source]]", 1)[0] + sources + "\n[pulsar]" + tail.replace(
        "\n[spool]", extra.format(pub=pub) + "\n[spool]", 1)
    d = Rigd(tmp_path, cfg)
    try:
        for secs in (1.3, 2.2):
            d.start()
            d.wait_for(lambda st: st["uplink"]["connected"] and st["uplink"]["published"] >= published,
                       timeout=90, what="publishing")
            time.sleep(secs)
            d.kill9()
        d.start()
        # The earlier runs' backlog drains (a gap in the seqs below says if it did not) and new
        # frames follow it.
        backlog = d.status()["spool"]["records"]
        d.wait_for(lambda s: s["uplink"]["connected"] and s["uplink"]["published"] >= backlog + published,
                   timeout=90, what="drained")
        assert d.stop() == 0
        log = d.log()
        assert "the topic's last message decides" in log, log[-3000:]
        assert "cannot read the topic's last message" not in log, log[-3000:]
    finally:
        d.close()
    topic = f"persistent://{ns}/{rig}-{source}"
    msgs = consume(BROKER_URL, [topic], idle_timeout_s=8, consumer_type=pulsar.ConsumerType.Exclusive,
                   crypto_key_reader=pulsar.CryptoKeyReader(str(pub), str(priv)))
    assert_once_each_in_order([int(m["properties"]["seq"]) for m in msgs], source)
    if variant == "lz4-chunks":
        # The premise: each frame took several entries (chunks).
        entries = admin("GET", f"/admin/v2/persistent/{ns}/{rig}-{source}/internalStats")["numberOfEntries"]
        assert entries > len(msgs), (entries, len(msgs))


def test_after_the_broker_forgot_the_producer_a_restart_still_sends_nothing_twice(tmp_path):
    """A broker of its own with dedup on and the inactivity timeout lowered to 1 minute."""
    sh = str(ROOT / "tests/pulsar/broker.sh")
    port, http = free_port(), free_port()
    env = {**os.environ, "PULSAR_DATA": str(tmp_path / "broker"), "PULSAR_PORT": str(port),
           "PULSAR_HTTP_PORT": str(http), "PULSAR_BOOKIE_PORT": str(free_port()),
           "PULSAR_DEDUP": "1", "PULSAR_DEDUP_INACTIVITY_MIN": "1"}
    subprocess.run([sh, "start"], env=env, capture_output=True, text=True, check=True)
    url = f"pulsar://127.0.0.1:{port}"
    try:
        rig = unique("park")
        d = Rigd(tmp_path, CONFIG.format(rig=rig, url=url, ns="public/default"))
        try:
            kill9_runs(d, [2.3])
            # Parked: the broker purges a producer inactive for 1 min at its next check (every
            # minute).
            time.sleep(135)
            d.start()
            d.wait_for(lambda s: s["uplink"]["connected"] and s["spool"]["records"] < 40, timeout=60,
                       what="drained")
            assert d.stop() == 0
            log = d.log()
            assert "the topic's last message decides" in log, "the broker still remembered the producer"
        finally:
            d.close()
        assert_once_each(url, "public/default", rig)
    finally:
        subprocess.run([sh, "stop"], env=env, capture_output=True, text=True)
