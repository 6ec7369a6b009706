"""The command line and config handling, as an operator meets them."""

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from harness import ROOT, Rigd, free_port, rigd_bin

BASE = '[rig]\nid = "cli"\n'

BAD = {
    "unknown key": (BASE + "[spool]\nmax-byts = 5\n", "max-byts"),
    "wrong type": (BASE + "[web]\nbind = 8088\n", "web.bind"),
    "negative rate": (BASE + '[[source]]\nid = "g"\nkind = "synthetic-serial"\nrate-hz = -5\n', "source[0].rate-hz"),
    "missing required key": ('[rig]\nbucket-ms = 33\n', "id"),
    "unknown topic placeholder": (BASE + '[pulsar]\ntopic = "persistent://a/b/{rig}-{sensor}-{source}"\n', "pulsar.topic"),
    "unknown source kind": (BASE + '[[source]]\nid = "x"\nkind = "lidar"\n', "lidar"),
    "not toml": ("[rig\nid=", ""),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_check_rejects_bad_config_with_one_line_naming_the_key(case, tmp_path):
    text, key = BAD[case]
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    r = subprocess.run([rigd_bin(), "check", "--config", str(cfg)], capture_output=True, text=True)
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert key in lines[0] and "bad.toml" in lines[0], lines[0]
    # `run` refuses the same config the same way, before starting anything.
    r = subprocess.run([rigd_bin(), "run", "--config", str(cfg)], capture_output=True, text=True, timeout=10)
    assert r.returncode == 2


def test_check_accepts_the_shipped_configs():
    for cfg in list((ROOT / "examples").glob("*.toml")) + list((ROOT / "systemd").glob("*.toml")):
        r = subprocess.run([rigd_bin(), "check", "--config", str(cfg)], capture_output=True, text=True)
        assert r.returncode == 0, (cfg, r.stderr)


def test_usage_errors_exit_2_and_help_exits_0():
    assert subprocess.run([rigd_bin(), "frobnicate"], capture_output=True).returncode == 2
    assert subprocess.run([rigd_bin(), "--help"], capture_output=True).returncode == 0
    assert subprocess.run([rigd_bin(), "run", "--help"], capture_output=True).returncode == 0


def test_unreachable_broker_keeps_capturing_and_logs_once_per_state_change(tmp_path):
    dead = free_port()  # nothing listens here
    cfg = f"""
[rig]
id = "offline"
[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 50
[[source]]
id = "cam"
kind = "synthetic-camera"
width = 64
height = 48
fps = 10
[pulsar]
url = "pulsar://127.0.0.1:{dead}"
[spool]
path = "spool"
[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""
    d = Rigd(tmp_path, cfg).start()
    try:
        time.sleep(6)
        s = d.status()
        assert not s["uplink"]["connected"]
        assert s["uplink"]["last_error"], s["uplink"]
        gps = next(x for x in s["sources"] if x["id"] == "gps")
        assert gps["frames"] > 100, gps
        assert s["spool"]["records"] >= gps["frames"] - 5, s["spool"]
        assert d.stop() == 0
    finally:
        d.close()
    log = d.log()
    # Several reconnect attempts happened, but each source's outage is logged once.
    for source in ("gps", "cam"):
        lines = [l for l in log.splitlines() if "uplink down" in l and f"offline-{source}" in l]
        assert len(lines) == 1, lines


def test_embedded_default_runs_without_broker_and_serves_status(tmp_path):
    # The embedded default binds 8088; run it from a temp dir so its spool lands there.
    p = subprocess.Popen([rigd_bin(), "run"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        d = Rigd(tmp_path, BASE)
        d.port = 8088
        d.proc = p
        d.log_path = tmp_path / "none.log"
        try:
            d.wait_ready(timeout=20)
        except RuntimeError:
            pytest.skip("port 8088 is taken on this machine")
        s = d.wait_for(lambda s: all(x["frames"] > 5 for x in s["sources"]), timeout=20, what="frames")
        assert {x["id"] for x in s["sources"]} == {"front", "mic", "gps"}
        assert s["spool"]["records"] > 0
    finally:
        p.terminate()
        assert p.wait(timeout=20) == 0
    assert (tmp_path / "rigd-spool").is_dir()


def _control_status(d: Rigd, token: str) -> int:
    """HTTP status of a control action (pause the uplink) with this bearer token."""
    req = urllib.request.Request(d.url("/api/uplink/pause"), data=b"", method="POST",
                                 headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _wait_log(d: Rigd, text: str, count: int, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if d.log().count(text) >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"no {count}x {text!r} in the log:\n{d.log()[-3000:]}")


def test_sighup_reloads_the_web_token_keeps_running_and_sigterm_still_shuts_down_clean(tmp_path):
    # SIGHUP's default action ended rigd (exit 129) with an unclean spool.
    token = tmp_path / "web.token"
    token.write_text("first\n")
    cfg = f"""
[rig]
id = "hup"
[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 50
[spool]
path = "spool"
[web]
bind = "127.0.0.1:{{WEB_PORT}}"
token-file = "{token}"
"""
    d = Rigd(tmp_path, cfg).start()
    try:
        assert _control_status(d, "second") == 401
        assert _control_status(d, "first") not in (401, 403)
        token.write_text("second\n")
        d.proc.send_signal(signal.SIGHUP)
        _wait_log(d, "SIGHUP: reloaded", 1)
        assert d.proc.poll() is None, d.log()[-3000:]
        assert d.get("/healthz").startswith(b"ok")
        assert _control_status(d, "first") == 401
        assert _control_status(d, "second") not in (401, 403)
        # A removed token file disables control actions, as at start; several SIGHUPs in a row.
        token.unlink()
        for _ in range(3):
            d.proc.send_signal(signal.SIGHUP)
            time.sleep(0.2)
        _wait_log(d, "SIGHUP: reloaded", 4)
        assert d.status()["control_enabled"] is False
        assert _control_status(d, "second") == 403
        frames = next(x for x in d.status()["sources"] if x["id"] == "gps")["frames"]
        d.wait_for(lambda s: next(x for x in s["sources"] if x["id"] == "gps")["frames"] > frames + 20,
                   timeout=10, what="capture going on")
        assert d.proc.poll() is None
        assert d.stop() == 0
    finally:
        d.close()
    assert "need a restart" in d.log()
    assert "rigd stopped" in d.log()
    # The spool was closed cleanly: the next start finds nothing to recover.
    again = Rigd(tmp_path, cfg, name="again").start()
    try:
        assert again.stop() == 0
    finally:
        again.close()
    assert "did not shut down cleanly" not in again.log(), again.log()


def test_a_closed_stderr_pipe_does_not_stop_capture_or_the_web_ui(tmp_path):
    # tracing's fmt layer fell back to eprintln! when a log write failed, which panics on EPIPE in
    # whichever thread logged: tokio workers and capture threads died, /healthz stopped answering
    # and SIGTERM no longer stopped the daemon.
    port = free_port()
    cfg = tmp_path / "rigd.toml"
    cfg.write_text(f"""
[rig]
id = "epipe"
[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 50
[[source]]
id = "cam"
kind = "synthetic-camera"
width = 64
height = 48
fps = 10
[[source]]
id = "tty"
kind = "serial"
device = "{tmp_path}/no-such-tty"
[spool]
path = "spool"
[web]
bind = "127.0.0.1:{port}"
""")
    r, w = os.pipe()
    # debug: every thread logs (lanes, the web server, the serial source's capture thread retrying).
    p = subprocess.Popen([rigd_bin(), "run", "--config", str(cfg)], cwd=tmp_path, stdout=subprocess.DEVNULL,
                         stderr=w, env={**os.environ, "RIGD_LOG": "debug"})
    os.close(w)
    d = Rigd(tmp_path / "client", BASE)
    d.port, d.proc = port, p
    try:
        os.set_blocking(r, False)
        deadline = time.time() + 30
        seen = b""
        while b"rigd running" not in seen:
            assert time.time() < deadline and p.poll() is None, seen[-3000:]
            try:
                seen = (seen + os.read(r, 1 << 16))[-(1 << 16):]
            except BlockingIOError:
                time.sleep(0.05)
        d.wait_ready()
        os.close(r)
        r = None
        p.send_signal(signal.SIGHUP)  # one more log line, from the signal task
        before = {x["id"]: x["frames"] for x in d.status()["sources"]}
        for _ in range(4):
            time.sleep(1)
            assert p.poll() is None, "rigd exited after its stderr closed"
            assert d.get("/healthz", timeout=2).startswith(b"ok")
        s = d.status()
        after = {x["id"]: x["frames"] for x in s["sources"]}
        assert after["gps"] > before["gps"] + 100, (before, after)
        assert after["cam"] > before["cam"] + 20, (before, after)
        tty = next(x for x in s["sources"] if x["id"] == "tty")
        assert tty["state"] == "retrying", tty
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 0
    finally:
        if r is not None:
            os.close(r)
        d.close()
