"""What the broker refuses, handled by kind (docs/UPLINK.md "Broker errors"): a topic policy that
refuses a frame (NotAllowed: max message size on the topic) is refused and counted while the other
sources go on and nothing stalls or reconnects in a loop; a terminated topic is reported, its frames
stay in the spool, the other sources go on and shutdown stays bounded. The official Python client
counts what arrived."""

import json
import subprocess
import time
import urllib.parse

from harness import BROKER_URL, Rigd, admin, received_seqs, rigd_bin, unique


def config(rig, cam_bytes, fps=5):
    return f"""
[rig]
id = "{rig}"

[[source]]
id = "cam"
kind = "synthetic-camera"
width = 160
height = 120
fps = {fps}
frame-bytes = {cam_bytes}

[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 20

[pulsar]
url = "{BROKER_URL}"

[spool]
path = "spool"

[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""


def topic_path(rig, source):
    return f"/admin/v2/persistent/public/default/{urllib.parse.quote(f'{rig}-{source}')}"


def seqs_of(rig, source):
    return received_seqs(f"persistent://public/default/{rig}-{source}")


def source_status(status, sid):
    return next(s for s in status["sources"] if s["id"] == sid)


def test_a_topic_policy_that_refuses_frames_is_counted_and_the_other_sources_go_on(broker, tmp_path):
    rig = unique("policy")
    # The camera's topic takes at most 100 kB per message; its frames are 200 kB.
    admin("PUT", topic_path(rig, "cam"))
    admin("POST", topic_path(rig, "cam") + "/maxMessageSize", 100_000)
    deadline = time.time() + 30
    while admin("GET", topic_path(rig, "cam") + "/maxMessageSize") != 100_000 and time.time() < deadline:
        time.sleep(0.5)  # topic policies apply asynchronously
    d = Rigd(tmp_path, config(rig, 200_000))
    try:
        d.start()
        s = d.wait_for(lambda s: source_status(s, "cam")["refused"] >= 10 and source_status(s, "gps")["published"] >= 100,
                       timeout=60, what="camera frames refused while gps publishes")
        reconnects = s["uplink"]["reconnects"]
        time.sleep(3)
        s = d.status()
        assert s["uplink"]["reconnects"] == reconnects, "a refusal must not reconnect"
        assert s["uplink"]["connected"], s["uplink"]
        assert s["spool"]["records"] < 20, "refused frames are not kept spooling"
        assert d.stop() == 0
        log = d.log()
        assert "frame refused by the uplink" in log and "NotAllowedError" in log, log[-3000:]
    finally:
        d.close()
    assert seqs_of(rig, "cam") == [], "the policy lets nothing of 200 kB through"
    gps = seqs_of(rig, "gps")
    assert gps == list(range(len(gps))) and len(gps) >= 100


def test_a_terminated_topic_is_reported_its_frames_stay_spooled_and_the_rest_goes_on(broker, tmp_path):
    rig = unique("term")
    d = Rigd(tmp_path, config(rig, 20_000))
    try:
        d.start()
        d.wait_for(lambda s: source_status(s, "cam")["published"] >= 5, timeout=60, what="camera publishing")
        admin("POST", topic_path(rig, "cam") + "/terminate")
        s = d.wait_for(lambda s: "terminated" in (s["uplink"].get("last_error") or ""), timeout=30,
                       what="the terminated topic reported")
        assert s["uplink"]["terminated"] == ["cam"], s["uplink"]
        assert any("terminated" in a["text"] and "cam" in a["text"] for a in s["alerts"]), s["alerts"]
        gps_before = source_status(s, "gps")["published"]
        time.sleep(3)
        s = d.status()
        assert source_status(s, "gps")["published"] > gps_before + 30, "gps goes on"
        t0 = time.time()
        assert d.stop() == 0
        assert time.time() - t0 < 10
        assert "topic terminated" in d.log()
    finally:
        d.close()
    # Nothing of the camera is lost: what the broker holds plus what the spool holds is every seq.
    cam = seqs_of(rig, "cam")
    assert cam == list(range(len(cam)))
    out = subprocess.run([rigd_bin(), "spool", "stat", "--spool", str(tmp_path / "spool"), "--json"],
                         capture_output=True, text=True, check=True)
    spooled = next(x for x in json.loads(out.stdout)["sources"] if x["id"] == "cam")
    assert spooled["records"] > 0, out.stdout


def test_a_topic_terminated_under_frames_in_flight_takes_frames_again_once_recreated(broker, tmp_path):
    """Issue 31.1: the topic is terminated while 200 kB frames stream at 10 fps; an operator
    deletes it and it is created anew: the camera publishes again without a restart (a terminated
    topic is looked at again every 60 s), its spooled frames follow, and the recreated topic holds
    each of them once. The broker ends a termination by closing its producers; a SEND that reaches
    it while its ledger closes comes back first as SEND_ERROR TopicTerminatedError, the path that
    left the window refusing frames for good. That window is milliseconds wide on loopback (not hit
    in the runs tried at 10 and 100 fps), so the pure decision is proven by the window's unit test
    (a_topic_terminated_under_frames_in_flight_takes_frames_again_once_a_producer_is_created) and
    this test proves the recovery against the real broker, printing which path it took."""
    rig = unique("reterm")
    d = Rigd(tmp_path, config(rig, 200_000, fps=10))
    try:
        d.start()
        d.wait_for(lambda s: source_status(s, "cam")["published"] >= 20, timeout=60, what="camera publishing")
        admin("POST", topic_path(rig, "cam") + "/terminate")
        # The broker fences the topic while it terminates it (ServiceNotReady to a new producer):
        # on a loaded machine that took over 30 s with 100 fps of 200 kB frames in flight. A write
        # that fails under the termination can also leave the topic fenced until it is unloaded
        # (apache/pulsar#5284, #20526: the broker's own fault; CI met it once, the topic still
        # fenced after 90 s). The operator's remedy then is the same as for a terminated topic
        # (unload it, delete it): rigd must recover either way, which is what this test is about.
        try:
            s = d.wait_for(lambda s: s["uplink"]["terminated"] == ["cam"], timeout=90,
                           what="the termination reported")
        except AssertionError:
            s = d.status()
            if "TopicFenced" not in (s["uplink"].get("last_error") or ""):
                raise
            print("the broker kept the topic fenced (apache/pulsar#5284): unloading it", s["uplink"])
            admin("PUT", topic_path(rig, "cam") + "/unload")
        at_termination = source_status(s, "cam")["published"]
        admin("DELETE", topic_path(rig, "cam") + "?force=true")
        d.wait_for(lambda s: s["uplink"]["terminated"] == [] and s["uplink"]["connected"]
                   and source_status(s, "cam")["published"] >= at_termination + 20,
                   timeout=150, what="the camera publishing to the recreated topic")
        d.wait_for(lambda s: source_status(s, "cam")["spooled_records"] == 0, timeout=60,
                   what="the camera's spooled frames drained")
        assert d.stop() == 0
        lines = [x for x in d.log().splitlines() if "topic terminated by the broker" in x]
        print("termination seen as:", "a SEND_ERROR" if any("PRODUCER_SUCCESS" not in x for x in lines)
              else "a refusal of the next producer", lines)
    finally:
        d.close()
    cam = seqs_of(rig, "cam")
    assert len(cam) == len(set(cam)), "each frame once"
    assert len(cam) >= 20, (len(cam), at_termination)
