"""The web server's limits on a running rigd (web/src/serve.rs, docs/WEB.md "Limits"): half-open
HTTP connections neither block the API nor hold SIGTERM open, and more connections than the cap do
not raise the daemon's open file descriptors past the cap. No broker: everything spools."""

import os
import socket
import time

from harness import Rigd

# rigd_web::ServeLimits::default()
HEADER_TIMEOUT_S = 5
MAX_CONNECTIONS = 128

CONFIG = """
[rig]
id = "van-07"

[[source]]
id = "front"
kind = "synthetic-camera"
width = 320
height = 240
fps = 15

[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 10

[spool]
path = "spool"

[web]
bind = "127.0.0.1:{WEB_PORT}"
"""

HALF_HEAD = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n"


def open_fds(d: Rigd) -> int:
    return len(os.listdir(f"/proc/{d.proc.pid}/fd"))


def connect(d: Rigd, send: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", d.port), timeout=5)
    if send:
        s.sendall(send)
    return s


def is_open(s: socket.socket) -> bool:
    """Nothing to read and no EOF yet: the server still holds the connection."""
    s.setblocking(False)
    try:
        return s.recv(1) != b""  # data on a half head would be a bug; EOF means closed
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        s.setblocking(True)


def timed_healthz(d: Rigd) -> float:
    t0 = time.monotonic()
    assert d.get("/healthz", timeout=3) == b"ok\n"
    return time.monotonic() - t0


def test_200_half_open_connections_neither_block_the_api_nor_hold_sigterm(tmp_path):
    d = Rigd(tmp_path, CONFIG).start()
    held = []
    try:
        t0 = time.monotonic()
        for _ in range(200):
            held.append(connect(d, HALF_HEAD))
        stream = connect(d, b"GET /api/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert b"200 OK" in stream.recv(4096)
        held.append(stream)
        # The API answers at once while they are held (the cap makes room by closing the
        # longest-idle half-open connection).
        worst = max(timed_healthz(d) for _ in range(5))
        assert worst < 1.0, f"/healthz took {worst:.2f} s"
        assert d.status()["rig"] == "van-07"
        still_held = sum(is_open(s) for s in held)
        assert still_held >= MAX_CONNECTIONS - 8, still_held
        # SIGTERM while they are still inside the header deadline: held, not yet timed out.
        assert time.monotonic() - t0 < HEADER_TIMEOUT_S - 0.5, "too slow to test what it says"
        t1 = time.monotonic()
        code = d.stop(timeout=15)
        took = time.monotonic() - t1
        print(f"SIGTERM to exit with {still_held} half-open connections held and a live stream: "
              f"{took:.2f} s")
        assert code == 0
        assert took < 10, f"exit took {took:.1f} s"
        assert "rigd stopped" in d.log()
    finally:
        for s in held:
            s.close()
        d.close()


def test_connections_past_the_cap_do_not_raise_open_fds(tmp_path):
    d = Rigd(tmp_path, CONFIG).start()
    held = []
    try:
        time.sleep(0.5)
        baseline = open_fds(d)
        for i in range(3 * MAX_CONNECTIONS):
            # Alternate silent connections and half-sent heads.
            held.append(connect(d, HALF_HEAD if i % 2 else b""))
        time.sleep(0.3)
        peak = open_fds(d)
        server_held = sum(is_open(s) for s in held)
        print(f"fds: baseline {baseline}, with {len(held)} client connections {peak} "
              f"(+{peak - baseline}); connections the daemon holds: {server_held}")
        assert server_held <= MAX_CONNECTIONS, server_held
        assert peak <= baseline + MAX_CONNECTIONS + 16, (baseline, peak)
        assert timed_healthz(d) < 1.0
        # Past the header deadline the daemon has closed them all.
        time.sleep(HEADER_TIMEOUT_S + 1)
        after = open_fds(d)
        print(f"fds after the header deadline: {after}")
        assert after <= baseline + 8, (baseline, after)
        assert not any(is_open(s) for s in held)
        t1 = time.monotonic()
        assert d.stop(timeout=15) == 0
        assert time.monotonic() - t1 < 10
    finally:
        for s in held:
            s.close()
        d.close()
