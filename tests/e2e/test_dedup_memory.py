"""When the broker keeps no deduplication state for rigd's producer — deduplication off, or the
state forgotten after brokerDeduplicationProducerInactivityTimeoutMinutes (6 h by default: a vehicle
parked overnight) — a restart reads the topic's last message instead (docs/UPLINK.md, "Overnight
park"), so frames of the earlier run that the spool still holds but the broker already stored are
not sent twice. `always` mode with kill -9 leaves exactly such frames: acked, their removal not yet
committed. The official client counts every seq."""

import os
import subprocess
import time
import urllib.error

from harness import BROKER_URL, ROOT, Rigd, admin, assert_once_each_in_order, free_port, received_seqs, unique

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
    ns = f"public/{unique('nodedup')}"
    try:
        admin("PUT", f"/admin/v2/namespaces/{ns}", {})
    except urllib.error.HTTPError as e:
        if e.code != 409:
            raise
    admin("POST", f"/admin/v2/namespaces/{ns}/deduplication", False)
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
