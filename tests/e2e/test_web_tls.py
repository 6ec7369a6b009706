"""The web UI over HTTPS (issue 19): `[web] tls-cert-file` / `tls-key-file`. A real TLS client
(curl, Python's ssl) reaches the page and the API with the CA that signed the certificate, the
control token goes over TLS only, plain HTTP is refused, and a client that never starts the
handshake is closed at the header deadline. Needs no broker."""

import socket
import subprocess
import time
from pathlib import Path

from harness import Rigd, rigd_bin

TOKEN = "tls-test-token-7f3a"


def make_certs(d: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 it signed (openssl, as a fleet's PKI would)."""
    d.mkdir(parents=True, exist_ok=True)
    run = lambda *a: subprocess.run(["openssl", *a], cwd=d, check=True, capture_output=True)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=rigd test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "web.key", "-out", "web.csr",
        "-subj", "/CN=127.0.0.1")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "web.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "web.pem", "-days", "2", "-extfile", "ext.cnf")
    return d / "ca.pem", d / "web.pem", d / "web.key"


def config(tmp_path, cert, key, extra=""):
    (tmp_path / "web.token").write_text(TOKEN + "\n")
    return f"""
[rig]
id = "tls-rig"

[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 10

[spool]
path = "spool"

[web]
bind = "127.0.0.1:{{WEB_PORT}}"
token-file = "{tmp_path / 'web.token'}"
tls-cert-file = "{cert}"
tls-key-file = "{key}"
{extra}
"""


def curl(*args):
    return subprocess.run(["curl", "-sS", "--max-time", "10", *args], capture_output=True, text=True)


def test_https_serves_the_page_and_api_and_refuses_plain_http(tmp_path):
    ca, cert, key = make_certs(tmp_path / "pki")
    d = Rigd(tmp_path, config(tmp_path, cert, key), tls_ca=ca).start()
    try:
        base = f"https://127.0.0.1:{d.port}"
        r = curl("--cacert", str(ca), f"{base}/healthz")
        assert r.returncode == 0 and r.stdout.startswith("ok"), (r.returncode, r.stdout, r.stderr)
        r = curl("--cacert", str(ca), f"{base}/")
        assert r.returncode == 0 and "<html" in r.stdout.lower(), r.stderr
        # A client that does not trust the certificate's CA stops at the handshake.
        r = curl(f"{base}/healthz")
        assert r.returncode != 0, r.stdout
        # The control token travels inside TLS; a wrong one is still refused.
        r = curl("--cacert", str(ca), "-X", "POST", "-H", f"Authorization: Bearer {TOKEN}",
                 "-o", "/dev/null", "-w", "%{http_code}", f"{base}/api/uplink/pause")
        assert r.stdout == "200", (r.stdout, r.stderr)
        r = curl("--cacert", str(ca), "-X", "POST", "-H", "Authorization: Bearer nope",
                 "-o", "/dev/null", "-w", "%{http_code}", f"{base}/api/uplink/pause")
        assert r.stdout in ("401", "403"), r.stdout
        # Plain HTTP on the TLS port gets no page: the handshake fails and the connection closes.
        r = curl(f"http://127.0.0.1:{d.port}/healthz")
        assert r.returncode != 0 and "ok" not in r.stdout, (r.returncode, r.stdout)
        # A client that connects and never says a word is closed at the header deadline (5 s),
        # not held open forever.
        with socket.create_connection(("127.0.0.1", d.port), timeout=15) as s:
            t0 = time.time()
            assert s.recv(1) == b""
            waited = time.time() - t0
        assert 3 < waited < 12, waited
        # And the server is still there for the technician.
        s = d.status()
        assert s["uplink"]["paused"] is True, s["uplink"]
        assert TOKEN not in d.log()
        assert d.stop() == 0
    finally:
        d.close()


def check(path: Path):
    return subprocess.run([rigd_bin(), "check", "--config", str(path)], capture_output=True, text=True,
                          timeout=60)


def test_tls_settings_that_cannot_work_are_refused_before_start(tmp_path):
    ca, cert, key = make_certs(tmp_path / "pki")
    cases = {
        "cert without key": (f'tls-cert-file = "{cert}"\n', "web.tls-key-file"),
        "key without cert": (f'tls-key-file = "{key}"\n', "web.tls-cert-file"),
        "garbage certificate": (None, "no certificate"),
        "key of another certificate": (None, "is the key the certificate's?"),
    }
    for name, (web, want) in cases.items():
        path = tmp_path / f"{name.replace(' ', '-')}.toml"
        if web is not None:
            text = (f'[rig]\nid = "tls-rig"\n[[source]]\nid = "gps"\nkind = "synthetic-serial"\n'
                    f'[spool]\npath = "{tmp_path / "spool"}"\n[web]\nbind = "127.0.0.1:0"\n{web}')
        elif name == "garbage certificate":
            bad = tmp_path / "garbage.pem"
            bad.write_text("not a certificate\n")
            text = config(tmp_path, bad, key)
        else:
            _, other, _ = make_certs(tmp_path / "other")
            text = config(tmp_path, other, key)
        path.write_text(text.replace("{WEB_PORT}", "0"))
        r = check(path)
        assert r.returncode == 2, (name, r.returncode, r.stdout, r.stderr)
        assert want in r.stdout + r.stderr, (name, r.stdout, r.stderr)


def test_the_live_view_is_served_over_wss_with_the_same_certificate(tmp_path):
    """Issue 29: with `[web]` TLS the live view is `wss://` (Foxglove's client, the fleet's CA)."""
    import json
    ca, cert, key = make_certs(tmp_path / "pki")
    d = Rigd(tmp_path, config(tmp_path, cert, key), tls_ca=ca).start()
    try:
        client = Path(__file__).resolve().parent.parent / "web" / "live_client.mjs"
        r = subprocess.run(["node", str(client), f"wss://127.0.0.1:{d.port}/foxglove", "--ca", str(ca),
                            "--protocol", "foxglove.sdk.v1", "--subscribe", "/gps", "--seconds", "1.5"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["protocol"] == "foxglove.sdk.v1"
        # The rig's markers and alerts as foxglove.Log on /events come after the sources' channels.
        assert [c["topic"] for c in out["channels"]] == ["/gps", "/gps/fix", "/events"]
        assert sum(m["topic"] == "/gps" for m in out["messages"]) >= 5, out["messages"][:3]
    finally:
        assert d.stop() == 0
