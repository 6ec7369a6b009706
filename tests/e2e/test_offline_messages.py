"""What the offline tools say when something is wrong, with the real binary (issue 47): each case
asserts the exit code and the words a user acts on, and that the old, untrue words are gone.

- an unreachable broker (a closed loopback port): `recall --coverage`, `replay --pulsar` and `tail`
  say the broker is unreachable at its URL and exit 1 after a deadline; nothing about a control
  topic the request never reached, or a spool the frames never go to;
- `replay --out` onto a file or into a non-empty directory: exit 2 naming the path and what to do;
  `--force` writes into the directory;
- `spool verify` on a damaged index: exit 1;
- a garbage `RIG` file: damaged, and what to do, not "a spool from before rigd recorded it";
- `rigd tail` and `rigd recall` against a broker that requires a client certificate: they reach it
  with `--tls-cert-file/--tls-key-file` and fail clearly without them.
"""

import json
import shutil
import socket
import subprocess
import time

import pytest

from harness import Rigd, TlsBroker, free_port, rigd_bin, unique

pytestmark = pytest.mark.xdist_group("offline-messages")  # one worker makes the module's spool


def rigd(*args, timeout=120):
    return subprocess.run([rigd_bin(), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def closed_port() -> str:
    """A loopback URL nothing listens on (connections refused at once)."""
    port = free_port()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
    return f"pulsar://127.0.0.1:{port}"


def rig_config(rig: str, pulsar: str = "") -> str:
    return f"""
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
rate-hz = 20
{pulsar}
[spool]
path = "spool"
[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""


@pytest.fixture(scope="module")
def spooled(tmp_path_factory):
    """A spool of 2 s of synthetic capture without a broker, the daemon stopped."""
    work = tmp_path_factory.mktemp("spooled")
    d = Rigd(work, rig_config("depot")).start()
    try:
        time.sleep(2)
        assert d.stop() == 0
    finally:
        d.close()
    return work / "spool"


def test_an_unreachable_broker_is_said_so_with_its_url_and_a_deadline(spooled):
    url = closed_port()
    t0 = time.monotonic()
    r = rigd("recall", "--pulsar", url, "--rig", "depot", "--coverage")
    took = time.monotonic() - t0
    assert r.returncode == 1, r
    assert f"{url}: the broker is unreachable" in r.stderr and "Connection refused" in r.stderr, r.stderr
    assert "nothing was sent to the rig" in r.stderr, r.stderr
    assert "control topic" not in r.stderr, r.stderr   # the request never got there
    assert took < 20, f"{took:.1f} s: the connection deadline is 15 s, not --timeout's 600"
    # Only the tool's own line: not the pulsar crate's retry log.
    assert "retrying" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr

    r = rigd("replay", "--spool", spooled, "--pulsar", url, "--timeout", "3")
    assert r.returncode == 1, r
    assert f"pulsar {url}: the broker is unreachable (connect to" in r.stderr, r.stderr
    assert "for 3 s (--timeout); nothing was published" in r.stderr, r.stderr
    assert "spool" not in r.stderr.replace(str(spooled), ""), r.stderr   # "frames go to the spool": not a tool's
    assert "no progress" not in r.stderr, r.stderr

    t0 = time.monotonic()
    r = rigd("tail", "--pulsar", url, "--rig", "depot")
    assert r.returncode == 1, r
    assert f"pulsar {url}: the broker is unreachable" in r.stderr, r.stderr
    assert time.monotonic() - t0 < 20


def test_replay_out_refuses_a_file_and_a_non_empty_directory_unless_force(spooled, tmp_path):
    f = tmp_path / "export.bin"
    f.write_text("keep me")
    r = rigd("replay", "--spool", spooled, "--out", f)
    assert r.returncode == 2, r
    assert f"--out {f}: a file is there" in r.stderr and "--mcap FILE" in r.stderr, r.stderr
    assert "File exists" not in r.stderr, r.stderr
    assert f.read_text() == "keep me"

    out = tmp_path / "out"
    assert rigd("replay", "--spool", spooled, "--out", out).returncode == 0
    first = sorted(p.relative_to(out) for p in out.rglob("*"))
    stale = out / "cam" / "1-999999.jpg"
    stale.write_bytes(b"an earlier export's frame")
    r = rigd("replay", "--spool", spooled, "--out", out, "--source", "gps")
    assert r.returncode == 2, r
    assert f"--out {out} is not empty (it holds cam, ... 2 entries)" in r.stderr, r.stderr
    assert "--force" in r.stderr, r.stderr
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == sorted(first + [stale.relative_to(out)])
    # With --force it writes into it: same names replaced, the others stay.
    r = rigd("replay", "--spool", spooled, "--out", out, "--source", "gps", "--force", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["records"] > 0
    assert stale.exists() and (out / "gps.ndjson").stat().st_size > 0
    # An empty directory is fine without --force.
    (tmp_path / "empty").mkdir()
    assert rigd("replay", "--spool", spooled, "--out", tmp_path / "empty").returncode == 0
    # --force is for an output that exists: not for --pulsar.
    r = rigd("replay", "--spool", spooled, "--pulsar", closed_port(), "--force")
    assert r.returncode == 2 and "--force goes with --out DIR or --mcap FILE" in r.stderr, r.stderr


@pytest.mark.parametrize("damage", ["removed", "garbage"])
def test_verify_exits_1_on_a_damaged_index(spooled, tmp_path, damage):
    copy = tmp_path / "copy"
    shutil.copytree(spooled, copy)
    db = copy / "index" / "db"
    if damage == "removed":
        db.unlink()
    else:
        data = bytearray(db.read_bytes())
        for i in range(100, len(data), 97):
            data[i] ^= 0xFF
        db.write_bytes(bytes(data))
    r = rigd("spool", "verify", "--spool", copy)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "verify: FAILED: the index is damaged" in r.stdout, r.stdout
    assert "rebuilds it from the segments" in r.stdout, r.stdout
    j = rigd("spool", "verify", "--spool", copy, "--json")
    assert j.returncode == 1
    v = json.loads(j.stdout)
    assert not v["ok"] and v["index_damage"] and v["corrupt"] == [], v
    # stat lists the same spool from the segments and exits 0 (it says, it does not judge).
    s = rigd("spool", "stat", "--spool", copy)
    assert s.returncode == 0 and "index damaged:" in s.stdout, s.stdout


def test_a_garbage_rig_file_is_reported_damaged_with_what_to_do(spooled, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(spooled, work / "spool")
    rig_file = work / "spool" / "RIG"
    rig_file.write_bytes(b"\x00\xfe\x13garbage\n" * 4)
    s = rigd("spool", "stat", "--spool", work / "spool")
    assert s.returncode == 0, s.stderr
    assert f"rig: unknown: {rig_file} is damaged (not UTF-8 text)" in s.stdout, s.stdout
    assert "--rig" in s.stdout and "next start" in s.stdout, s.stdout
    assert "from before" not in s.stdout, s.stdout
    j = json.loads(rigd("spool", "stat", "--spool", work / "spool", "--json").stdout)
    assert "rig" not in j and "is damaged" in j["rig_damage"], j
    r = rigd("replay", "--spool", work / "spool", "--pulsar", closed_port())
    assert r.returncode == 2, r
    assert "the rig is unknown" in r.stderr and "is damaged" in r.stderr and "--rig" in r.stderr, r.stderr
    # A TOML file of the wrong shape is damaged too, with toml's one-line reason.
    rig_file.write_text('rig = "x"\nbucket-ms = "a"\n')
    s = rigd("spool", "stat", "--spool", work / "spool")
    assert "is damaged (invalid type: string" in s.stdout, s.stdout
    # What the message promises: the daemon writes it again at its next start on the spool.
    d = Rigd(work, rig_config("depot")).start()
    try:
        assert d.stop() == 0
    finally:
        d.close()
    s = rigd("spool", "stat", "--spool", work / "spool", "--json")
    assert json.loads(s.stdout)["rig"]["rig"] == "depot", s.stdout


def test_tail_and_recall_reach_a_broker_that_requires_a_client_certificate(tmp_path):
    """A broker whose TLS port requires a certificate from the fleet CA (TLS authentication
    provider, no token): a rig publishes to it with its certificate; `rigd tail` with
    --tls-cert-file/--tls-key-file prints its buckets, without them it fails within the
    connection deadline saying the broker refused it; `rigd recall` likewise gets as far as the
    request (which the rig answers or not: this rig has no on-request source to recall)."""
    b = TlsBroker(tmp_path, PULSAR_TLS_CLIENT_AUTH="1")
    tls = b.tls
    b.run("start")
    rig = unique("mtls-tail")
    cert = ["--tls-ca", str(tls / "ca.pem"), "--tls-cert-file", str(tls / "client.pem"),
            "--tls-key-file", str(tls / "client.key.pem")]
    d = None
    try:
        d = Rigd(tmp_path, rig_config(rig, f'[pulsar]\nurl = "{b.url}"\ntls-ca-file = "{tls / "ca.pem"}"\n'
                                           f'tls-cert-file = "{tls / "client.pem"}"\n'
                                           f'tls-key-file = "{tls / "client.key.pem"}"')).start()
        d.wait_for(lambda s: s["uplink"]["connected"] and s["uplink"]["published"] > 20, timeout=90,
                   what="the rig publishing over mutual TLS")
        r = rigd("tail", "--pulsar", b.url, "--rig", rig, "--source", "gps", "--max-buckets", "5", "--json",
                 *cert, timeout=90)
        assert r.returncode == 0, r.stderr
        lines = [json.loads(x) for x in r.stdout.splitlines()]
        assert len(lines) == 5 and all("gps" in x["sources"] for x in lines), r.stdout

        t0 = time.monotonic()
        r = rigd("tail", "--pulsar", b.url, "--rig", rig, "--tls-ca", str(tls / "ca.pem"), timeout=90)
        assert r.returncode == 1, r
        assert f"pulsar {b.url}: the broker is unreachable" in r.stderr, r.stderr
        assert "it requires a client certificate (mutual TLS): give --tls-cert-file and --tls-key-file" \
            in r.stderr, r.stderr
        assert time.monotonic() - t0 < 25

        # recall: with the certificate the request goes out (no rig answers in 3 s: no
        # on-request source here); without, the broker is unreachable and nothing is sent.
        r = rigd("recall", "--pulsar", b.url, "--rig", rig, "--coverage", "--timeout", "3", *cert, timeout=90)
        assert r.returncode == 1 and "request" in r.stderr and "sent to" in r.stderr, r.stderr
        assert "no answer from the rig in 3 s" in r.stderr, r.stderr
        r = rigd("recall", "--pulsar", b.url, "--rig", rig, "--coverage", "--tls-ca", str(tls / "ca.pem"),
                 timeout=90)
        assert r.returncode == 1 and "nothing was sent to the rig" in r.stderr, r.stderr
        assert "it requires a client certificate (mutual TLS)" in r.stderr, r.stderr
        # A certificate with a clear link is a usage error, said before connecting.
        r = rigd("tail", "--pulsar", "pulsar://127.0.0.1:1", "--rig", rig, *cert[2:])
        assert r.returncode == 2 and "--tls-cert-file goes with a pulsar+ssl:// URL" in r.stderr, r.stderr
        r = rigd("tail", "--pulsar", b.url, "--rig", rig, "--tls-cert-file", str(tls / "client.pem"))
        assert r.returncode == 2 and "--tls-key-file" in r.stderr, r.stderr
    finally:
        if d is not None:
            d.stop()
            d.close()
        b.stop()
