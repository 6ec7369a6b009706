"""The technician's browser as the attacker's way in (docs/SECURITY.md, "The browser"): a page of
another site, open in headless Chromium on the rig's network, tries to read the rig through DNS
rebinding and to open its live view; everything is refused, and the rig's own page still shows
everything, live view included. Also `rigd live`'s own gate: loopback by default, the same
origin rule, and no decrypted frames in clear beyond loopback."""

import http.client
import json
import os
import socket
import socketserver
import subprocess
import threading
import time
from pathlib import Path

from harness import BROKER_URL, ROOT, Rigd, free_port, rigd_bin
from test_web import SOURCES, chromium

EVIL_NAME = "rebind.test"
EVIL_PAGE = b"<!doctype html><title>attacker</title><p>cat pictures</p>"


class Rebinder(socketserver.ThreadingTCPServer):
    """The attacker's server at 127.0.0.3: its page at `/`, every other path forwarded byte for
    byte to the rig, as the rig itself would be reached once the attacker's name resolves to it
    (the `Host` header still names the attacker)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, rig_port: int):
        self.rig_port = rig_port
        self.forwarded = 0
        super().__init__(("127.0.0.3", 0), RebinderHandler)


class RebinderHandler(socketserver.BaseRequestHandler):
    def handle(self):
        head = b""
        self.request.settimeout(10)
        while b"\r\n\r\n" not in head:
            chunk = self.request.recv(65536)
            if not chunk:
                return
            head += chunk
        path = head.split(b" ", 2)[1]
        if path == b"/":
            self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nConnection: close\r\n"
                                 b"Content-Length: %d\r\n\r\n" % len(EVIL_PAGE) + EVIL_PAGE)
            return
        self.server.forwarded += 1
        rig = socket.create_connection(("127.0.0.1", self.server.rig_port), timeout=10)
        rig.sendall(head)

        def pipe(src, dst):
            try:
                while True:
                    b = src.recv(65536)
                    if not b:
                        break
                    dst.sendall(b)
            except OSError:
                pass
            finally:
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        back = threading.Thread(target=pipe, args=(rig, self.request), daemon=True)
        back.start()
        pipe(self.request, rig)
        back.join(timeout=10)
        rig.close()


def run_browser(script: str, *args: str) -> dict:
    assert (ROOT / "tests/web/node_modules/playwright-core").is_dir(), "run tests/setup.sh (npm ci in tests/web)"
    out = subprocess.run(["node", str(ROOT / "tests" / "web" / script), *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "CHROMIUM": chromium()})
    lines = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    assert lines and lines[-1]["step"] == "done", f"{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return lines[-1]


def test_another_sites_page_reads_nothing_and_the_rigs_own_page_everything(tmp_path):
    web = '[web]\nbind = "127.0.0.1:{WEB_PORT}"\n'
    d = Rigd(tmp_path, f'[rig]\nid = "van-07"\n{SOURCES}\n[spool]\npath = "spool"\n{web}').start()
    evil = Rebinder(d.port)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        d.wait_for(lambda s: any(x["preview_seq"] is not None for x in s["sources"]), timeout=30,
                   what="a camera preview")
        seen = run_browser("attacker.mjs", d.url(""), f"http://{EVIL_NAME}:{evil.server_address[1]}/")
        log = d.log()
    finally:
        evil.shutdown()
        evil.server_close()
        d.stop()
        d.close()
    a, own = seen["attacker"], seen["own"]
    assert evil.forwarded >= 2, "the rebound requests never reached the rig"
    # DNS rebinding: the attacker's name reached the rig and was refused (421), nothing read.
    assert a["status"].get("code") == 421 and not a["status"].get("gps"), a
    assert a["preview_read"].get("code") == 421 and not a["preview_read"].get("jpeg"), a
    # The preview shown cross-site in an <img>: refused by its fetch metadata.
    assert a["preview_img"] == {"loaded": False}, a
    # The live view from another site's page: no upgrade, no frame.
    assert not a["live"]["opened"] and a["live"]["binary"] == 0 and a["live"]["text"] == 0, a
    # The rig's own page: everything.
    assert own["status"]["code"] == 200 and own["status"]["gps"], own
    assert own["preview_read"] == {"code": 200, "jpeg": True}, own
    assert own["preview_img"]["loaded"] and own["preview_img"]["width"] == 320, own
    assert own["live"]["opened"] and own["live"]["ops"][:2] == ["serverInfo", "advertise"], own
    assert own["live"]["binary"] > 0, f"no frame reached the rig's own page: {own}"
    # Refusals are answers, not faults of the rig: nothing at ERROR level for them.
    assert " ERROR " not in log, log[-3000:]


def http_get(host: str, port: int, path: str, headers: dict | None = None,
             source: str = "127.0.0.2") -> tuple[int, str]:
    """GET from the loopback address `source` (the peer `--allow-from` judges)."""
    c = http.client.HTTPConnection(host, port, timeout=5, source_address=(source, 0))
    try:
        c.request("GET", path, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        c.close()


def test_rigd_live_keeps_the_same_gate_and_no_decrypted_frames_in_clear(tmp_path):
    """`rigd live` on the shared broker: a non-loopback bind with
    --decrypt-key and no TLS is refused (exit 2), a peer outside --allow-from gets 403, another
    site's WebSocket and a rebound name are refused."""
    key = tmp_path / "fleet.pem"
    subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True)
    key.chmod(0o600)
    closed = free_port()
    out = subprocess.run([rigd_bin(), "live", "--pulsar", f"pulsar://127.0.0.1:{closed}", "--rig", "van-07",
                          "--bind", "0.0.0.0:0", "--decrypt-key", str(key)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2, out
    assert "--web-tls-cert-file" in out.stderr + out.stdout, out

    port = free_port()
    live = subprocess.Popen([rigd_bin(), "live", "--pulsar", BROKER_URL, "--rig", "van-07",
                             "--bind", f"0.0.0.0:{port}", "--allow-from", "127.0.0.2/32"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 15
        while True:
            try:
                if http_get("127.0.0.2", port, "/healthz")[0] == 200:
                    break
            except OSError:
                pass
            assert live.poll() is None and time.time() < deadline, "rigd live never answered"
            time.sleep(0.2)
        # 127.0.0.1 is loopback but not on --allow-from: 403.
        code, body = http_get("127.0.0.2", port, "/healthz", source="127.0.0.1")
        assert code == 403 and "allow-from" in body, (code, body)
        # A rebound name: 421.
        code, body = http_get("127.0.0.2", port, "/healthz", {"Host": f"rebind.test:{port}"})
        assert code == 421, (code, body)
        # Another site's WebSocket: 403 before any upgrade; a native client (no Origin) gets the upgrade.
        upgrade = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
                   "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                   "Sec-WebSocket-Protocol": "foxglove.websocket.v1"}
        code, body = http_get("127.0.0.2", port, "/foxglove", {**upgrade, "Origin": "http://evil.example"})
        assert code == 403 and "allowed-origins" in body, (code, body)
        s = socket.create_connection(("127.0.0.2", port), timeout=5, source_address=("127.0.0.2", 0))
        s.sendall(("GET /foxglove HTTP/1.1\r\nHost: 127.0.0.2:%d\r\n" % port
                   + "".join(f"{k}: {v}\r\n" for k, v in upgrade.items()) + "\r\n").encode())
        assert s.recv(4096).startswith(b"HTTP/1.1 101"), "a native client is refused"
        s.close()
    finally:
        live.terminate()
        live.wait(timeout=15)
