"""The technician's web UI and HTTP API on a running rigd: /metrics parsed by the Prometheus text
parser, control actions over real HTTP (token, pause/resume, event markers on the broker, spool
drop), hostile requests, and the page itself in headless Chromium (tests/web/browser.mjs) with
screenshots at phone and laptop widths in tests/artifacts/."""

import http.client
import json
import os
import queue
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness import ROOT, Rigd, consume, free_port, unique

TOKEN = "field-tech-7f3a-2c91"
ARTIFACTS = ROOT / "tests" / "artifacts"

SOURCES = """
[[source]]
id = "front"
kind = "synthetic-camera"
width = 320
height = 240
fps = 15

[[source]]
id = "mic"
kind = "synthetic-audio"
channels = 1

[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 10
"""


def config(tmp_path, rig="van-07", pulsar_url=None, token=True, extra_sources=""):
    web = '[web]\nbind = "127.0.0.1:{WEB_PORT}"\n'
    if token:
        (tmp_path / "web.token").write_text(TOKEN + "\n")
        web += f'token-file = "{tmp_path / "web.token"}"\n'
    pulsar = f'[pulsar]\nurl = "{pulsar_url}"\n' if pulsar_url else ""
    return f'[rig]\nid = "{rig}"\n{SOURCES}{extra_sources}\n{pulsar}[spool]\npath = "spool"\n{web}'


def request(d: Rigd, method: str, path: str, body: bytes | None = None, token: str | None = TOKEN,
            headers: dict | None = None):
    """(status, parsed JSON or text) without raising on 4xx/5xx."""
    h = dict(headers or {})
    if token is not None:
        h["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(d.url(path), data=body, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            code, raw, ctype = r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        code, raw, ctype = e.code, e.read(), e.headers.get("Content-Type", "")
    return code, json.loads(raw) if ctype.startswith("application/json") else raw.decode(errors="replace")


def raw_get(d: Rigd, path: str) -> int:
    """GET with the path sent exactly as given (no client-side normalisation)."""
    c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=10)
    c.putrequest("GET", path, skip_host=False, skip_accept_encoding=True)
    c.endheaders()
    code = c.getresponse().status
    c.close()
    return code


def metrics(d: Rigd) -> dict:
    """Family name -> family, parsed by the Prometheus text parser."""
    text = d.get("/metrics").decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(families, name, sample_name=None, **labels):
    for s in families[name].samples:
        if s.name == (sample_name or name) and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise AssertionError(f"no sample {sample_name or name}{labels} in {families[name].samples[:8]}")


def test_metrics_parse_with_the_prometheus_parser_and_count_up(tmp_path):
    d = Rigd(tmp_path, config(tmp_path)).start()
    try:
        d.wait_for(lambda s: all(x["frames"] > 5 for x in s["sources"]), timeout=20, what="frames")
        m1 = metrics(d)
        time.sleep(1.5)
        m2 = metrics(d)
    finally:
        assert d.stop() == 0
    assert all(name.startswith("rigd_") for name in m2), sorted(m2)
    # The parser strips _total from counter family names.
    for fam, kind in [("rigd_source_frames", "counter"), ("rigd_source_bytes", "counter"),
                      ("rigd_source_drops", "counter"), ("rigd_spool_pushed", "counter"),
                      ("rigd_spool_popped", "counter"), ("rigd_spool_quarantined", "counter"),
                      ("rigd_spool_bytes", "gauge"), ("rigd_uplink_connected", "gauge"),
                      ("rigd_clock_state", "gauge"), ("rigd_clock_offset_seconds", "gauge"),
                      ("rigd_publish_latency_seconds", "histogram"), ("rigd_events_marked", "counter")]:
        assert fam in m2, f"missing {fam}: {sorted(m2)}"
        assert m2[fam].type == kind, (fam, m2[fam].type)
    for src in ("front", "mic", "gps"):
        f1 = sample(m1, "rigd_source_frames", "rigd_source_frames_total", source=src)
        f2 = sample(m2, "rigd_source_frames", "rigd_source_frames_total", source=src)
        assert f2 > f1 > 0, (src, f1, f2)
        # No broker: every frame is spooled, nothing leaves (depth = pushed - popped).
        pushed = sample(m2, "rigd_spool_pushed", "rigd_spool_pushed_total", source=src)
        popped = sample(m2, "rigd_spool_popped", "rigd_spool_popped_total", source=src)
        assert pushed > 0 and popped == 0, (src, pushed, popped)
        assert sample(m2, "rigd_source_drops", "rigd_source_drops_total", source=src, stage="spool") == 0
    assert sample(m2, "rigd_spool_bytes") > 0
    assert sample(m2, "rigd_uplink_connected") == 0
    assert sample(m2, "rigd_clock_state", state="unsynced") == 1


def test_publish_latency_histogram_and_quantiles_with_a_broker(broker, tmp_path):
    rig = unique("web")
    d = Rigd(tmp_path, config(tmp_path, rig=rig, pulsar_url=broker)).start()
    try:
        # Rates need two looks at the counters at least half a second apart.
        s = d.wait_for(lambda s: s["uplink"]["connected"] and s["uplink"]["latency_samples"] > 20
                       and s["uplink"]["publish_rate"], timeout=60, what="receipts")
        m = metrics(d)
    finally:
        assert d.stop() == 0
    assert 0 < s["uplink"]["latency_p50_ms"] <= s["uplink"]["latency_p99_ms"] < 30_000, s["uplink"]
    assert s["uplink"]["publish_rate"] > 0
    count = sample(m, "rigd_publish_latency_seconds", "rigd_publish_latency_seconds_count", source="front")
    inf = sample(m, "rigd_publish_latency_seconds", "rigd_publish_latency_seconds_bucket",
                 source="front", le="+Inf")
    within_50s = sample(m, "rigd_publish_latency_seconds", "rigd_publish_latency_seconds_bucket",
                     source="front", le="50")
    assert count == inf > 0 and within_50s > 0
    assert sample(m, "rigd_uplink_connected") == 1
    assert sample(m, "rigd_uplink_published", "rigd_uplink_published_total", source="front") > 0


def test_readyz_says_what_keeps_the_rig_from_its_job_where_healthz_says_it_answers(tmp_path):
    """Issue 32: `/healthz` is always "ok"; `/readyz` is 200 only while the rig does its whole
    job, else 503 with the reasons (here: a broker configured and not reachable)."""
    d = Rigd(tmp_path / "alone", config(tmp_path / "alone", token=False)).start()
    try:
        d.wait_for(lambda s: all(x["frames"] > 0 for x in s["sources"]), timeout=30, what="frames")
        code, body = request(d, "GET", "/readyz", token=None)
        assert (code, body) == (200, {"ready": True, "reasons": []}), body
    finally:
        d.stop()
        d.close()
    dead = f"pulsar://127.0.0.1:{free_port()}"
    d = Rigd(tmp_path / "cut", config(tmp_path / "cut", pulsar_url=dead, token=False)).start()
    try:
        d.wait_for(lambda s: s["uplink"]["last_error"], timeout=30, what="a failed connection")
        assert d.get("/healthz") == b"ok\n"
        code, body = request(d, "GET", "/readyz", token=None)
        assert code == 503 and body["ready"] is False and "uplink: not connected" in body["reasons"], body
    finally:
        d.stop()
        d.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="a network namespace and a veth pair need root")
def test_clients_outside_the_allowed_networks_get_403_on_every_route(tmp_path):
    """Issue 32: bound to 0.0.0.0 (as a technician's rig is), the page, its preview and the last
    serial records were served to anyone who could reach the port, the cellular side included.
    A client in a namespace of its own, over a veth pair, from a private address (10.x, allowed
    by default) and from a public one (203.0.113.x, refused unless `allow-from` names it)."""
    tag = f"{os.getpid()}-{os.urandom(2).hex()}"
    ns, host_if, ns_if = f"rigdweb-{tag}", f"rwh{tag[-4:]}", f"rwn{tag[-4:]}"

    def ip(*args, check=True):
        return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)

    ip("netns", "add", ns)
    try:
        ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        ip("link", "set", ns_if, "netns", ns)
        for a in ("10.250.7.1/24", "203.0.113.1/24"):
            ip("addr", "add", a, "dev", host_if)
        for a in ("10.250.7.2/24", "203.0.113.2/24"):
            ip("netns", "exec", ns, "ip", "addr", "add", a, "dev", ns_if)
        ip("link", "set", host_if, "up")
        ip("netns", "exec", ns, "ip", "link", "set", ns_if, "up")
        ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")

        def get(d, src, dst, path):
            r = subprocess.run(["ip", "netns", "exec", ns, "curl", "-s", "-m", "5", "--interface", src,
                                "-o", "/dev/null", "-w", "%{http_code}", f"http://{dst}:{d.port}{path}"],
                               capture_output=True, text=True)
            return int(r.stdout or 0)

        paths = ["/", "/api/status", "/api/sources/front/preview.jpg", "/metrics", "/healthz"]
        for allow, private, public in [(None, 200, 403), ('["203.0.113.0/24", "127.0.0.1"]', 403, 200)]:
            cfg = config(tmp_path, token=False).replace('bind = "127.0.0.1:{WEB_PORT}"', 'bind = "0.0.0.0:{WEB_PORT}"')
            if allow:
                cfg += f"allow-from = {allow}\n"
            d = Rigd(tmp_path / f"allow-{public}", cfg).start()
            try:
                d.wait_for(lambda s: s["sources"][0]["preview_seq"] is not None, timeout=30, what="a preview")
                got = {(src, p): get(d, src, dst, p) for src, dst in (("10.250.7.2", "10.250.7.1"),
                                                                       ("203.0.113.2", "203.0.113.1"))
                       for p in paths}
                want = {(src, p): code for src, code in (("10.250.7.2", private), ("203.0.113.2", public))
                        for p in paths}
                assert got == want, (allow, got)
            finally:
                d.stop()
                d.close()
    finally:
        ip("link", "del", host_if, check=False)
        ip("netns", "del", ns, check=False)


def test_control_needs_a_configured_token(tmp_path):
    d = Rigd(tmp_path, config(tmp_path, token=False)).start()
    try:
        for method, path in [("POST", "/api/uplink/pause"), ("POST", "/api/uplink/resume"),
                             ("POST", "/api/events"), ("DELETE", "/api/spool/front?confirm=front")]:
            code, body = request(d, method, path, body=b"" if method == "POST" else None)
            assert code == 403, (method, path, code, body)
            assert "token-file" in body["error"]
        assert d.status()["control_enabled"] is False
    finally:
        assert d.stop() == 0


def test_control_actions_over_http(tmp_path):
    d = Rigd(tmp_path, config(tmp_path)).start()
    try:
        d.wait_for(lambda s: s["sources"][0]["spooled_records"] > 10, timeout=20, what="spooled frames")
        for token in (None, "wrong", TOKEN + "x"):
            code, _ = request(d, "POST", "/api/uplink/pause", b"", token=token)
            assert code == 401
        assert d.status()["uplink"]["paused"] is False

        code, body = request(d, "POST", "/api/uplink/pause", b"")
        assert (code, body) == (200, {"paused": True})
        assert d.status()["uplink"]["paused"] is True
        code, body = request(d, "POST", "/api/uplink/resume", b"")
        assert (code, body) == (200, {"paused": False})

        code, body = request(d, "POST", "/api/events", json.dumps({"note": "pothole at km 12"}).encode(),
                             headers={"Content-Type": "application/json"})
        assert code == 201, body
        assert body["note"] == "pothole at km 12" and body["bucket"] == body["capture_ns"] // 1_000_000 // 33
        s = d.wait_for(lambda s: s["events"]["marked"] == 1, timeout=5, what="event counted")
        assert json.loads(s["events"]["last"][-1])["event"] == "pothole at km 12"

        # Dropping a spool: without the confirmation nothing happens.
        code, body = request(d, "DELETE", "/api/spool/front")
        assert code == 400 and "?confirm=front" in body["error"]
        code, body = request(d, "DELETE", "/api/spool/nope?confirm=nope")
        assert code == 404
        before = d.status()["sources"][0]["spooled_records"]
        code, body = request(d, "DELETE", "/api/spool/front?confirm=front")
        assert code == 200 and body["source"] == "front" and body["dropped"] >= before > 0, (body, before)
        s = d.status()
        front = s["sources"][0]
        assert front["spool_dropped"] >= before and front["spooled_records"] < before
        assert any("dropped" in a["text"] for a in s["alerts"])
    finally:
        assert d.stop() == 0


def test_hostile_requests_are_bounded(tmp_path):
    d = Rigd(tmp_path, config(tmp_path)).start()
    streams = []
    try:
        code, _ = request(d, "POST", "/api/events", b"{" + b"x" * (64 * 1024) + b"}")
        assert code == 413
        for bad in (b"{", b'{"note": 5}', b"\xff\xfe", b'{"other": 1}'):
            code, body = request(d, "POST", "/api/events", bad)
            assert code == 400 and body["error"].startswith("bad JSON"), (bad, code, body)
        for path in ("/assets/../Cargo.toml", "/assets/%2e%2e/%2e%2e/etc/passwd", "/../../etc/passwd",
                     "/assets/..%2f..%2fCargo.toml", "/api/sources/..%2f..%2fetc/preview.jpg",
                     "/assets//etc/passwd"):
            assert raw_get(d, path) == 404, path

        # At most 32 live streams; the 33rd gets 503 and the API stays responsive.
        for _ in range(32):
            s = socket.create_connection(("127.0.0.1", d.port), timeout=5)
            s.sendall(b"GET /api/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert b"200 OK" in s.recv(4096)
            streams.append(s)
        code, body = request(d, "GET", "/api/stream")
        assert code == 503 and "too many" in body["error"]
        assert d.status()["rig"] == "van-07"
        # Garbage on the wire does not hurt the daemon.
        g = socket.create_connection(("127.0.0.1", d.port), timeout=5)
        g.sendall(b"\x00\x01GARBAGE / HTTP/9.9\r\n\r\n")
        g.recv(4096)
        g.close()
        assert d.get("/healthz") == b"ok\n"
        # SIGTERM with 32 open streams: they end and rigd exits promptly.
        t0 = time.time()
        assert d.stop(timeout=15) == 0
        assert time.time() - t0 < 10
    finally:
        for s in streams:
            s.close()
        d.close()


def test_pause_spools_resume_drains_and_events_reach_the_broker(broker, tmp_path):
    rig = unique("web")
    d = Rigd(tmp_path, config(tmp_path, rig=rig, pulsar_url=broker)).start()
    try:
        d.wait_for(lambda s: s["uplink"]["connected"], timeout=60, what="uplink connected")
        assert request(d, "POST", "/api/uplink/pause", b"")[0] == 200
        s = d.wait_for(lambda s: all(x["spooled_records"] > 20 for x in s["sources"]), timeout=30,
                       what="frames spooling while paused")
        published = {x["id"]: x["published"] for x in s["sources"]}
        time.sleep(1)
        s = d.status()
        assert all(x["published"] == published[x["id"]] for x in s["sources"]), "published while paused"
        code, marked = request(d, "POST", "/api/events", json.dumps({"note": "paused marker"}).encode())
        assert code == 201 and marked["topic"].endswith(f"/{rig}-events")
        assert request(d, "POST", "/api/uplink/resume", b"")[0] == 200
        d.wait_for(lambda s: all(x["spooled_records"] < 20 for x in s["sources"])
                   and s["spool"]["records"] < 60, timeout=60, what="spool drained after resume")
        assert d.stop() == 0
    finally:
        d.close()
    msgs = consume(broker, [f"persistent://public/default/{rig}-events"], idle_timeout_s=5)
    assert len(msgs) == 1, msgs
    m = msgs[0]
    body = json.loads(m["payload"])
    assert body["event"] == "paused marker" and body["bucket"] == marked["bucket"]
    assert m["key"] == str(marked["bucket"]) == m["properties"]["bucket"]
    assert m["properties"]["source"] == "events" and m["properties"]["seq"] == str(marked["seq"])


def chromium() -> str:
    return os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


def test_page_in_headless_chromium(tmp_path):
    """The page a technician opens: live counters, camera thumbnail, level meter, serial lines,
    clock state, plain-word alerts for a failed source and an unreachable broker, an event marked
    through the page; then stale when rigd stops. Screenshots: tests/artifacts/web-{laptop,phone,laptop-stale}.png."""
    browser_js = ROOT / "tests" / "web" / "browser.mjs"
    assert (ROOT / "tests/web/node_modules/playwright-core").is_dir(), "run tests/setup.sh (npm ci in tests/web)"
    assert Path(chromium()).exists(), "run tests/setup.sh (Debian chromium)"
    closed = free_port()  # nothing listens: the broker is "down"
    extra = '\n[[source]]\nid = "rear-gps"\nkind = "serial"\ndevice = "/dev/ttyRIGD-UNPLUGGED"\n'
    d = Rigd(tmp_path, config(tmp_path, pulsar_url=f"pulsar://127.0.0.1:{closed}", extra_sources=extra)).start()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(["node", str(browser_js), d.url(""), str(ARTIFACTS)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "CHROMIUM": chromium(), "RIGD_TOKEN": TOKEN})
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(l) for l in proc.stdout] + [lines.put(None)], daemon=True).start()
    steps = {}
    try:
        deadline = time.time() + 120
        while time.time() < deadline and "done" not in steps and "error" not in steps:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                continue
            if line is None:
                break
            step = json.loads(line)
            steps.setdefault(step["step"], []).append(step)
            if step["step"] == "ready-for-outage":
                assert d.stop() == 0
                proc.stdin.write("stopped\n")
                proc.stdin.flush()
    finally:
        if proc.poll() is None:
            proc.kill()
        stderr = proc.stderr.read()
        proc.wait()
        d.close()
    assert "error" not in steps, steps["error"][0]["error"] + stderr[-2000:]
    assert "done" in steps, f"browser script did not finish: {steps}\n{stderr[-3000:]}"

    for seen in steps["checked"]:
        layout = seen["layout"]
        assert seen["clock"] == "UNSYNCED", seen
        for src in ("front", "mic", "gps"):
            a, b = seen["moving"][src]
            assert b > a, f"{layout}: {src} frame counter did not move ({a} -> {b})"
            assert seen["badges"][src] == "RUNNING"
        assert seen["thumbs"]["front"] == [320, 240]
        assert "dBFS" in seen["levels"]["mic"]
        assert "$GPRMC" in seen["records"]["gps"]
        assert seen["badges"]["rear-gps"] == "RETRYING"
        texts = [t for _, t in seen["alerts"]]
        assert any(t.startswith("Serial rear-gps is not capturing") for t in texts), texts
        assert any(t.startswith("Broker unreachable: spooling,") and "waiting" in t for t in texts), texts
        assert seen["horizontal_overflow_px"] <= 0, f"{layout} scrolls sideways"
        assert Path(seen["screenshot"]).stat().st_size > 10_000
    marked = json.loads(steps["action"][0]["result"].removeprefix("Done: "))
    assert marked["note"] == "marked from the page" and marked["seq"] == 0, marked
    assert steps["stale"][0]["banner"] is True
