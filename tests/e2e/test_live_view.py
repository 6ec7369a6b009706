"""The live view for Foxglove (issue 29): rigd's `/foxglove` WebSocket driven by Foxglove's own
client, @foxglove/ws-protocol's FoxgloveClient over `ws` (tests/web/live_client.mjs), with messages
decoded by the protobuf schema the server advertised. Camera frames seen live are the frames on
Pulsar (read with the official client); a client that stops reading costs capture and publish
nothing and is told what it lost."""

import contextlib
import json
import os
import socket
import subprocess
import time
from collections import Counter
from types import SimpleNamespace

import pytest

from harness import ROOT, Rigd, consume, unique

pytestmark = pytest.mark.xdist_group("live-view")  # one worker runs the module's rig once

CLIENT = ROOT / "tests" / "web" / "live_client.mjs"
SDK, WEBSOCKET = "foxglove.sdk.v1", "foxglove.websocket.v1"


def config(rig: str, broker: str | None, max_clients: int = 4, frame_bytes: str | None = None,
           fps: int = 30, pulsar_extra: str = "") -> str:
    pad = f'frame-bytes = "{frame_bytes}"\n' if frame_bytes else ""
    pulsar = f'[pulsar]\nurl = "{broker}"\n{pulsar_extra}' if broker else ""
    return f"""
[rig]
id = "{rig}"
[[source]]
id = "front"
kind = "synthetic-camera"
width = 320
height = 240
fps = {fps}
{pad}
[[source]]
id = "mic"
kind = "synthetic-audio"
channels = 1
[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 10
{pulsar}
[spool]
path = "spool"
[web]
bind = "127.0.0.1:{{WEB_PORT}}"
max-live-clients = {max_clients}
"""


def client_cmd(d: Rigd | SimpleNamespace, *args: str) -> list[str]:
    return ["node", str(CLIENT), f"ws://127.0.0.1:{d.port}/foxglove", *args]


def live(d: Rigd | SimpleNamespace, *args: str, timeout: float = 90) -> dict:
    """One run of the client; its JSON report."""
    r = subprocess.run(client_cmd(d, *args), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0 and r.stdout.strip(), f"client failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return json.loads(r.stdout)


def subscribe(*topics: str) -> list[str]:
    return [a for t in topics for a in ("--subscribe", t)]


@pytest.fixture(scope="module")
def rig(broker, tmp_path_factory):
    """One rig publishing to the broker, max-live-clients = 2, for the module's tests."""
    name = unique("live")
    d = Rigd(tmp_path_factory.mktemp("live"), config(name, broker, max_clients=2)).start()
    try:
        d.wait_for(lambda s: s["uplink"]["connected"] and all(x["frames"] > 0 for x in s["sources"]),
                   timeout=60, what="uplink connected and frames")
        yield name, d
    finally:
        d.stop()
        d.close()


EXPECTED_CHANNELS = [
    ("/front", "foxglove.CompressedImage"),
    ("/mic", "foxglove.RawAudio"),
    ("/gps", "foxglove.Log"),
    ("/gps/fix", "foxglove.LocationFix"),
]
# The rig also offers its markers and alerts; `rigd live` advertises `/events` with the events
# topic's first message.
RIG_CHANNELS = EXPECTED_CHANNELS + [("/events", "foxglove.Log")]


@pytest.mark.parametrize("protocol", [SDK, WEBSOCKET])
def test_each_subprotocol_is_echoed_with_server_info_and_one_channel_per_source(rig, protocol):
    _, d = rig
    out = live(d, "--protocol", protocol, "--seconds", "0.2")
    assert out["protocol"] == protocol
    info = out["serverInfo"]
    assert "time" in info["capabilities"] and info["name"].startswith("rigd "), info
    got = [(c["topic"], c["schemaName"]) for c in out["channels"]]
    assert got == RIG_CHANNELS, got
    assert all(c["encoding"] == "protobuf" and c["schemaEncoding"] == "protobuf" for c in out["channels"])
    assert not out["events"] or all("error" not in e for e in out["events"]), out["events"]


def test_neither_subprotocol_is_400_and_the_client_past_the_cap_is_refused_clearly(rig):
    _, d = rig
    out = live(d, "--protocol", "foxglove.sdk.v2", "--protocol", "graphql-ws")
    assert out["refused"] == 400, out
    assert SDK in out["body"] and WEBSOCKET in out["body"], out["body"]
    # max-live-clients = 2: two clients held open, the third refused with 503 naming the key.
    held = [subprocess.Popen(client_cmd(d, "--seconds", "6"), stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        d.wait_for(lambda s: s["live"]["clients"] == 2, timeout=15, what="two live clients")
        out = live(d, "--protocol", SDK)
        assert out["refused"] == 503, out
        assert "max-live-clients" in out["body"] and "at most 2" in out["body"], out["body"]
    finally:
        for p in held:
            p.wait(timeout=30)
    d.wait_for(lambda s: s["live"]["clients"] == 0, timeout=15, what="clients gone")
    assert live(d, "--protocol", SDK, "--seconds", "0.1")["protocol"] == SDK


def test_camera_frames_are_the_jpegs_on_pulsar_and_time_follows_the_newest_capture(rig, broker):
    name, d = rig
    out = live(d, "--protocol", SDK, *subscribe("/front", "/mic", "/gps", "/gps/fix"), "--seconds", "2.5")
    start = out["subscribedAt"]
    cams = [m for m in out["messages"] if m["topic"] == "/front"]
    # The first message can take a frame period and a round trip: count 2 s from the first one.
    assert cams, out["events"]
    first = cams[0]["at"]
    in_2s = [m for m in cams if m["at"] <= first + 2000]
    assert len(in_2s) >= 20, (len(in_2s), first - start)
    for m in cams:
        assert m.get("format") == "jpeg" and m["frameId"] == "front", m
        assert m["receiveNs"] == m["timestamp"], m
    counts = Counter(m["topic"] for m in out["messages"])
    assert counts["/mic"] >= 20 and counts["/gps"] >= 10 and counts["/gps/fix"] >= 5, counts
    fix = next(m for m in out["messages"] if m["topic"] == "/gps/fix")
    assert 47 < fix["latitude"] < 49 and 11 < fix["longitude"] < 12, fix

    # The same frames on Pulsar (the rig keeps publishing: read what is there by capture ns).
    same_on_pulsar(broker, name, cams)

    # Time messages: at least 1 Hz, never backwards, on the clock of the captures: never more than
    # 50 ms behind the newest capture the client has seen, and at most 500 ms ahead of it (a starved
    # CI machine delivered the newest frame 94 ms before a time message; a time message on another
    # clock than the captures' is off by far more).
    times = out["times"]
    assert len(times) >= 3, times
    ns = [int(t["ns"]) for t in times]
    assert ns == sorted(ns), ns
    gaps = [b["at"] - a["at"] for a, b in zip(times, times[1:])]
    assert max(gaps) <= 1000, gaps
    msgs = sorted(out["messages"], key=lambda m: m["at"])
    checked = 0
    for t in times:
        seen = [int(m["receiveNs"]) for m in msgs if m["at"] <= t["at"] and m["at"] >= start]
        if not seen:
            continue
        checked += 1
        assert -50_000_000 <= int(t["ns"]) - max(seen) <= 500_000_000, (t, max(seen))
    assert checked >= 2


def test_after_unsubscribe_messages_stop_within_200_ms(rig):
    _, d = rig
    out = live(d, "--protocol", WEBSOCKET, *subscribe("/front", "/mic"), "--seconds", "2",
               "--unsubscribe-after", "1")
    before = [m for m in out["messages"] if m["at"] <= out["unsubscribedAt"]]
    late = [m for m in out["messages"] if m["at"] > out["unsubscribedAt"] + 200]
    assert len(before) >= 20, len(before)
    assert not late, late[:3]
    s = d.status()
    assert s["live"]["clients"] == 0


def same_on_pulsar(broker: str, rig: str, cams: list[dict], **consume_args) -> None:
    """Each live camera message's JPEG is the payload of the Pulsar message with its capture ns (as
    the official client reads it: chunks reassembled, decrypted with `crypto_key_reader`)."""
    topic = f"persistent://public/default/{rig}-front"
    want = {m["timestamp"]: m["sha256"] for m in cams}
    on_pulsar = {}
    deadline = time.time() + 60
    while time.time() < deadline and not want.keys() <= on_pulsar.keys():
        # The rig goes on publishing: read for a bounded time, not until the topic is idle.
        for msg in consume(broker, [topic], idle_timeout_s=3, total_timeout_s=5, **consume_args):
            on_pulsar[msg["properties"]["capture-ns"]] = (msg["sha256"], int(msg["properties"]["seq"]))
    missing = want.keys() - on_pulsar.keys()
    assert not missing, f"{len(missing)} live frames not on Pulsar"
    for ns, sha in want.items():
        assert on_pulsar[ns][0] == sha, f"seq {on_pulsar[ns][1]}: live JPEG differs from Pulsar's"


def rates(d: Rigd, t0: float, s0: dict, t1: float, s1: dict) -> dict:
    """Per source: frames captured and published per second between two statuses, and records
    spooled between them (frames captured before the uplink connected are spooled at the start)."""
    out = {}
    for a, b in zip(s0["sources"], s1["sources"]):
        out[a["id"]] = {k: (b[k] - a[k]) / (t1 - t0) for k in ("frames", "published")}
        out[a["id"]]["spool_pushed"] = b["spool_pushed"] - a["spool_pushed"]
    return out


def rss_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_client_that_stops_reading_for_30_s_is_warned_counted_and_costs_capture_nothing(broker, tmp_path):
    """Two rigs side by side, the same sources (camera frames padded to 48 KiB so that 30 s are far
    more than the socket buffers and the 4 MiB queue hold): one with a client subscribed to
    everything that stops reading for 30 s, one without. Capture and publish rates of the first over
    the stall are at least 95 % of the other's; the stalled rig counts drops (camera, never serial), grows its
    RSS by less than 16 MiB + the queue bound, and the client gets a warning naming /front."""
    rigs = {k: Rigd(tmp_path / k, config(unique(f"live-{k}"), broker, frame_bytes="48KiB")) for k in ("slow", "none")}
    try:
        for d in rigs.values():
            d.start()
        for d in rigs.values():
            d.wait_for(lambda s: s["uplink"]["connected"] and all(x["published"] > 0 for x in s["sources"]),
                       timeout=60, what="publishing")
        slow = rigs["slow"]
        client = subprocess.Popen(client_cmd(slow, *subscribe("/front", "/mic", "/gps", "/gps/fix"),
                                             "--pause-after", "1", "--pause-for", "30", "--seconds", "2"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        slow.wait_for(lambda s: s["live"]["clients"] == 1, timeout=15, what="the live client")
        time.sleep(2)
        rss0 = rss_kib(slow.proc.pid)
        t0, s0 = time.time(), {k: d.status() for k, d in rigs.items()}
        time.sleep(26)
        t1, s1 = time.time(), {k: d.status() for k, d in rigs.items()}
        rss1 = rss_kib(slow.proc.pid)
        stdout, stderr = client.communicate(timeout=60)
        assert client.returncode == 0, stderr
        out = json.loads(stdout)
        metrics = slow.get("/metrics").decode()
    finally:
        for d in rigs.values():
            d.stop()
            d.close()
    r = {k: rates(rigs[k], t0, s0[k], t1, s1[k]) for k in rigs}
    for src in ("front", "mic", "gps"):
        for what in ("frames", "published"):
            # The stalled client's rig keeps up with the other one. One-sided: on this shared machine
            # either rig loses capture periods to CPU starvation (a run had the unwatched rig 1.04 %
            # behind, a loaded CI run the watched one 3.2 %: 27.8 against 28.7 frames/s). What this
            # guards against is capture held behind a client that stopped reading: the 4 MiB queue is
            # 3 s of this camera, so a capture that waited on it would fall to a tenth over the 26 s.
            a, b = r["slow"][src][what], r["none"][src][what]
            assert b > 0 and a >= b * 0.95, (src, what, a, b)
        assert r["slow"][src]["spool_pushed"] == r["none"][src]["spool_pushed"] == 0, r
    dropped = {src: s1["slow"]["sources"][i]["live_dropped"] for i, src in enumerate(("front", "mic", "gps"))}
    assert dropped["front"] > 0 and dropped["gps"] == 0, dropped
    assert all(s["live_dropped"] == 0 for s in s1["none"]["sources"])
    assert f'rigd_live_dropped_total{{source="front"}} {dropped["front"]}' in metrics or \
        'rigd_live_dropped_total{source="front"} ' in metrics
    warnings = [s for s in out["statuses"] if s["level"] == 1 and "/front" in s["message"]]
    assert warnings, out["statuses"]
    assert (rss1 - rss0) < (16 + 4) * 1024, (rss0, rss1)
    # After the stall the client is served again.
    assert any(m["at"] > out["resumedAt"] + 500 and m["topic"] == "/front" for m in out["messages"])


def test_rigd_check_names_a_bad_max_live_clients_and_exits_2(tmp_path):
    path = tmp_path / "rigd.toml"
    # Port 0: `check` probes the bind, and 8088 belongs to test_cli's group (a probe there at the
    # same instant made its one-line check report a second line, "cannot listen").
    path.write_text(config("live-check", None, max_clients=17).replace("{WEB_PORT}", "0"))
    r = subprocess.run([os.environ.get("RIGD_BIN") or str(ROOT / "target/release/rigd"), "check", "--config", str(path)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "web.max-live-clients" in r.stderr, r.stderr


@contextlib.contextmanager
def relay(broker: str, rig: str, tmp_path, *args: str):
    """`rigd live --pulsar URL --rig ID ARGS` on a free port, until SIGINT (exit 0 asserted). Yields
    what `live` needs of a server and, at the end, `.log` the relay's output (its summary line)."""
    from harness import free_port, rigd_bin
    port = free_port()
    log_path = tmp_path / f"live-{port}.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen([rigd_bin(), "live", "--pulsar", broker, "--rig", rig, "--bind", f"127.0.0.1:{port}", *args],
                            stdout=log, stderr=subprocess.STDOUT)
    fleet = SimpleNamespace(port=port, log="", log_path=log_path)
    try:
        deadline = time.time() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, log_path.read_text()
                time.sleep(0.2)
        yield fleet
    finally:
        proc.send_signal(2)
        try:
            assert proc.wait(timeout=15) == 0, log_path.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
            fleet.log = log_path.read_text()


def test_rigd_live_serves_the_same_channels_and_frames_from_pulsar(rig, broker, tmp_path):
    """`rigd live --pulsar URL --rig ID`: the fleet side, from the rig's topics (non-durable, from
    the latest message). The same client sees the same channels, advertised as each source's first
    message arrives, and camera frames equal to the ones on Pulsar."""
    name, d = rig
    with relay(broker, name, tmp_path) as fleet:
        out = live(fleet, "--protocol", SDK, "--want-channels", "4", *subscribe("/front", "/gps/fix"),
                   "--seconds", "2")
    got = sorted((c["topic"], c["schemaName"]) for c in out["channels"])
    assert got == sorted(EXPECTED_CHANNELS), got
    assert out["serverInfo"]["name"] == f"rigd live {name}"
    cams = [m for m in out["messages"] if m["topic"] == "/front"]
    assert len(cams) >= 20, len(cams)
    assert any(m["topic"] == "/gps/fix" for m in out["messages"]), Counter(m["topic"] for m in out["messages"])
    assert all(m.get("format") == "jpeg" and m["receiveNs"] == m["timestamp"] for m in cams)
    same_on_pulsar(broker, name, cams)
    times = [int(t["ns"]) for t in out["times"]]
    assert times == sorted(times) and len(times) >= 2, times


def test_rigd_live_decrypts_an_encrypted_rig_with_decrypt_key_and_says_what_it_skips_without(broker, tmp_path):
    """A rig with end-to-end encryption (`[pulsar] encryption-key-file`): `rigd live --decrypt-key`
    shows its camera frames, each equal to the frame the official Python client decrypts with the
    fleet's private key (CryptoKeyReader). Without the key, `rigd live` warns naming the option and
    counts what it skipped. (Uncompressed and unbatched: the `pulsar` crate underneath `rigd live`
    decompresses and splits batches before rigd sees a message, which it cannot do to ciphertext.)"""
    import pulsar
    from test_encryption import fleet_key
    pub, priv = fleet_key(tmp_path)
    name = unique("live-enc")
    extra = f'encryption-key-file = "{pub}"\nencryption-key-name = "fleet-2026"\nbatch-max-messages = 1\n'
    d = Rigd(tmp_path / "rig", config(name, broker, fps=10, pulsar_extra=extra)).start()
    try:
        d.wait_for(lambda s: s["uplink"]["connected"] and all(x["published"] > 0 for x in s["sources"]),
                   timeout=60, what="publishing")
        with relay(broker, name, tmp_path, "--decrypt-key", str(priv)) as fleet:
            out = live(fleet, "--protocol", SDK, "--want-channels", "4", *subscribe("/front", "/gps/fix"),
                       "--seconds", "3")
        with relay(broker, name, tmp_path) as blind:
            # The warning comes with the first encrypted message (10 camera frames a second).
            deadline = time.time() + 30
            while "--decrypt-key" not in blind.log_path.read_text() and time.time() < deadline:
                time.sleep(0.2)
    finally:
        d.stop()
        d.close()
    got = sorted((c["topic"], c["schemaName"]) for c in out["channels"])
    assert got == sorted(EXPECTED_CHANNELS), got
    cams = [m for m in out["messages"] if m["topic"] == "/front"]
    assert len(cams) >= 15, len(cams)  # 10 fps for 3 s
    assert any(m["topic"] == "/gps/fix" for m in out["messages"])
    assert "encrypted messages skipped" not in fleet.log, fleet.log
    reader = pulsar.CryptoKeyReader(str(pub), str(priv))
    same_on_pulsar(broker, name, cams, crypto_key_reader=reader)
    assert "end-to-end encrypted" in blind.log and "--decrypt-key FILE" in blind.log, blind.log
    assert "encrypted messages skipped (no --decrypt-key)" in blind.log, blind.log


def test_rigd_live_shows_camera_frames_larger_than_the_brokers_max_message_size_whole(broker, tmp_path):
    """6 MiB camera frames against the test broker's 5 MiB maxMessageSize: the rig sends each in two
    chunks. `rigd live` puts them back together (the one whose first chunk came before its
    subscription is dropped and counted), and the client gets each frame whole, equal to what the
    official client reassembles; the rig's own /foxglove shows them whole, too."""
    size = 6 << 20
    name = unique("live-big")
    d = Rigd(tmp_path / "rig", config(name, broker, fps=1, frame_bytes="6MiB")).start()
    try:
        d.wait_for(lambda s: s["uplink"]["connected"] and all(x["published"] > 0 for x in s["sources"]),
                   timeout=60, what="publishing")
        with relay(broker, name, tmp_path) as fleet:
            out = live(fleet, "--protocol", SDK, "--want-channels", "4", *subscribe("/front"), "--seconds", "5")
        on_rig = live(d, "--protocol", SDK, *subscribe("/front"), "--seconds", "3")
    finally:
        d.stop()
        d.close()
    cams = [m for m in out["messages"] if m["topic"] == "/front"]
    # 1 fps for 5 s; a loaded machine may take a frame period or two more to deliver the first.
    assert len(cams) >= 3, (len(cams), fleet.log)
    assert all(m["bytes"] == size and m["format"] == "jpeg" for m in cams), [m["bytes"] for m in cams]
    same_on_pulsar(broker, name, cams)
    assert "reassembled from chunks" in fleet.log, fleet.log
    rig_cams = [m for m in on_rig["messages"] if m["topic"] == "/front"]
    assert len(rig_cams) >= 2 and all(m["bytes"] == size for m in rig_cams), [m["bytes"] for m in rig_cams]


def test_a_marker_and_the_alerts_arrive_as_foxglove_log_on_the_rigs_events_channel(tmp_path):
    """On the rig's own /foxglove: `/events` (foxglove.Log, the channel `rigd live` makes of the events
    topic). The client subscribes, then POSTs a marker to /api/events: it arrives as a Log named
    `events` holding the marker, stamped with its capture time; the alert standing (no broker
    configured) arrives as a Log named `alert`."""
    token = tmp_path / "web.token"
    token.write_text("live-events-token")
    cfg = config(unique("live-ev"), None).replace("[web]\n", f'[web]\ntoken-file = "{token}"\n')
    d = Rigd(tmp_path, cfg).start()
    try:
        d.wait_for(lambda s: all(x["frames"] > 0 for x in s["sources"]), timeout=60, what="frames")
        out = live(d, "--protocol", WEBSOCKET, *subscribe("/events"), "--post-after", "0.5",
                   "--post", d.url("/api/events"), "--post-body", json.dumps({"note": "pothole at km 12"}),
                   "--post-token", "live-events-token",
                   "--seconds", "3")
    finally:
        d.stop()
        d.close()
    assert out["posted"]["status"] == 201, out["posted"]
    marked = json.loads(out["posted"]["body"])
    logs = [m for m in out["messages"] if m["topic"] == "/events"]
    markers = [m for m in logs if m["name"] == "events"]
    assert len(markers) == 1, logs
    assert json.loads(markers[0]["message"])["event"] == "pothole at km 12"
    assert markers[0]["timestamp"] == markers[0]["receiveNs"] == str(marked["capture_ns"]), (markers, marked)
    alerts = [m for m in logs if m["name"] == "alert"]
    assert any(m["message"].startswith("uplink: ") for m in alerts), logs
    assert all(m["level"] in (2, 3, 4) for m in alerts), alerts


def proxy_rig_config(rig: str, broker: str | None) -> str:
    """An H.264 camera with a proxy (both published live when there is a broker)."""
    pulsar = f'[pulsar]\nurl = "{broker}"\n' if broker else ""
    return f"""
[rig]
id = "{rig}"
[[source]]
id = "cam"
kind = "synthetic-camera"
codec = "h264"
width = 320
height = 180
gop = 10
proxy = {{ width = 160, height = 90, bitrate = "100kbit" }}
{pulsar}
[spool]
path = "spool"
[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""


def shown(out: dict) -> list[str]:
    """The topics advertised and not withdrawn."""
    gone = set(out.get("unadvertised", []))
    return sorted(c["topic"] for c in out["channels"] if c["id"] not in gone)


def test_a_camera_with_a_proxy_shows_the_proxy_and_its_full_resolution_only_with_full(tmp_path):
    """docs/LIVE.md "Proxies first": Foxglove's client sees `/cam-proxy` (CompressedVideo, its
    frames) and not `/cam`; connected with `?full=1` it sees both and gets the full frames."""
    d = Rigd(tmp_path, proxy_rig_config(unique("lvp"), None)).start()
    try:
        d.wait_for(lambda s: all(x["frames"] > 0 for x in s["sources"] if x["id"] != "events"),
                   timeout=30, what="frames")
        out = live(d, "--protocol", SDK, *subscribe("/cam-proxy", "/cam"), "--seconds", "1.5")
        assert "/cam-proxy" in shown(out) and "/cam" not in shown(out), shown(out)
        proxy = [m for m in out["messages"] if m["topic"] == "/cam-proxy"]
        assert len(proxy) >= 10 and all(m["format"] == "h264" and m["frameId"] == "cam-proxy" for m in proxy), \
            (len(proxy), out["events"])
        assert not [m for m in out["messages"] if m["topic"] == "/cam"]
        url = f"ws://127.0.0.1:{d.port}/foxglove?full=1"
        r = subprocess.run(["node", str(CLIENT), url, "--protocol", SDK, *subscribe("/cam", "/cam-proxy"),
                            "--seconds", "1.5"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        full = json.loads(r.stdout)
        assert {"/cam", "/cam-proxy"} <= set(shown(full)), shown(full)
        cams = [m for m in full["messages"] if m["topic"] == "/cam"]
        assert len(cams) >= 10 and all(m["format"] == "h264" and m["frameId"] == "cam" for m in cams), len(cams)
        proxies = [m for m in full["messages"] if m["topic"] == "/cam-proxy"]
        # The same pictures: every proxy frame has its full frame at the same capture time.
        lo, hi = min(int(m["timestamp"]) for m in cams), max(int(m["timestamp"]) for m in cams)
        inside = {m["timestamp"] for m in proxies if lo <= int(m["timestamp"]) <= hi}
        assert inside and inside <= {m["timestamp"] for m in cams}, (len(inside), len(cams))
    finally:
        d.stop()
        d.close()


def test_rigd_live_shows_the_proxy_and_the_full_resolution_with_full(broker, tmp_path):
    """`rigd live`: a camera whose `{id}-proxy` arrives is withdrawn from a default client's
    channels (`unadvertise`); `rigd live --full` keeps both for every client."""
    name = unique("lvr")
    d = Rigd(tmp_path, proxy_rig_config(name, broker)).start()
    try:
        d.wait_for(lambda s: s["uplink"]["connected"] and all(x["published"] > 0 for x in s["sources"]
                                                             if x["id"] != "events"),
                   timeout=60, what="both streams published")
        with relay(broker, name, tmp_path) as fleet:
            # The first client is there while the relay meets both sources (in either order); the
            # second connects to a relay that knows both.
            first = live(fleet, "--protocol", SDK, "--seconds", "2")
            out = live(fleet, "--protocol", SDK, *subscribe("/cam-proxy"), "--seconds", "1.5")
        # Connected before the relay met both: `/cam`, if it was advertised, was withdrawn.
        assert "/cam" not in shown(first), (shown(first), first["unadvertised"])
        print(f"first client: shown {shown(first)}, unadvertised {first['unadvertised']}")
        assert shown(out) == ["/cam-proxy"], (shown(out), out["channels"])
        assert [m for m in out["messages"] if m["topic"] == "/cam-proxy" and m["format"] == "h264"]
        with relay(broker, name, tmp_path, "--full") as fleet:
            out = live(fleet, "--protocol", SDK, "--want-channels", "2", *subscribe("/cam"), "--seconds", "1.5")
        assert {"/cam", "/cam-proxy"} <= set(shown(out)), shown(out)
        assert [m for m in out["messages"] if m["topic"] == "/cam" and m["format"] == "h264"]
    finally:
        d.stop()
        d.close()
