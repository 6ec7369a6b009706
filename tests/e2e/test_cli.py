"""The command line and config handling, as an operator meets them."""

import subprocess
import time

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
