"""The multi-node Pulsar cluster of tests/pulsar/cluster.sh for end-to-end tests: start it once
per session, find which broker owns a topic, kill a broker or bookie by its recorded pid, unload
and split bundles through the admin REST API, and drop a connection's packets on loopback so that
the broker keeps a dead client's connection (a vehicle that lost power mid-link)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from harness import ROOT, LoopbackQdisc

CLUSTER_SH = str(ROOT / "tests" / "pulsar" / "cluster.sh")


class Cluster:
    def __init__(self, data: Path | None = None):
        """The cluster whose files are in `data` (default: cluster.sh's own, $PULSAR_CLUSTER_DATA)."""
        self.env = {**os.environ} if data is None else {**os.environ, "PULSAR_CLUSTER_DATA": str(data)}
        self.refresh()
        self.data = Path(self.vars["PULSAR_CLUSTER_DATA"])

    def sh(self, *args, check=True, timeout=300) -> str:
        r = subprocess.run([CLUSTER_SH, *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"cluster.sh {' '.join(args)} failed ({r.returncode}):\n{r.stderr[-4000:]}")
        return r.stdout.strip()

    def refresh(self) -> dict:
        out = self.sh("env")
        self.vars = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        self.url = self.vars["PULSAR_CLUSTER_URL"]
        self.brokers = sorted(k[len("PULSAR_CLUSTER_"):-len("_ADMIN_URL")].lower().replace("_", "-")
                              for k in self.vars if k.startswith("PULSAR_CLUSTER_BROKER_") and k.endswith("_ADMIN_URL"))
        return self.vars

    def pid(self, node: str) -> int | None:
        v = self.refresh().get(f"PULSAR_CLUSTER_{node.upper().replace('-', '_')}_PID")
        return int(v) if v else None

    def admin_url(self, node: str) -> str:
        return self.vars[f"PULSAR_CLUSTER_{node.upper().replace('-', '_')}_ADMIN_URL"]

    def broker_url(self, node: str) -> str:
        return self.vars[f"PULSAR_CLUSTER_{node.upper().replace('-', '_')}_URL"]

    def live_brokers(self) -> list[str]:
        return [b for b in self.brokers if self.pid(b)]

    def admin(self, method: str, path: str, body=None, timeout=60, broker: str | None = None):
        """An admin request to `broker`, or to the first live broker (brokers redirect to the owner)."""
        last = None
        for b in ([broker] if broker else self.live_brokers()):
            url = self.admin_url(b) + path
            try:
                for _hop in range(5):
                    data = None if body is None else json.dumps(body).encode()
                    req = urllib.request.Request(url, data=data, method=method,
                                                 headers={"Content-Type": "application/json"})
                    try:
                        with urllib.request.urlopen(req, timeout=timeout) as r:
                            raw = r.read()
                            return json.loads(raw) if raw.strip().startswith((b"{", b"[")) else raw.decode()
                    except urllib.error.HTTPError as e:
                        # the owner answers (urllib follows a 307 only for GET)
                        if e.code in (307, 308) and e.headers.get("Location"):
                            url = e.headers["Location"]
                            continue
                        raise
            except urllib.error.HTTPError:
                raise
            except OSError as e:
                last = e
        raise RuntimeError(f"no broker answered {method} {path}: {last}")

    def namespace(self, name: str) -> str:
        """public/<name>, deduplication on (it is on broker-wide too)."""
        try:
            self.admin("PUT", f"/admin/v2/namespaces/public/{name}", {})
        except urllib.error.HTTPError as e:
            if e.code != 409:
                raise
        self.admin("POST", f"/admin/v2/namespaces/public/{name}/deduplication", True)
        return f"public/{name}"

    def owner(self, topic: str) -> str:
        """The broker node that owns `topic` (persistent://tenant/ns/name) now."""
        path = topic.replace("persistent://", "persistent/")
        r = self.admin("GET", f"/lookup/v2/topic/{path}")
        for b in self.brokers:
            if r["brokerUrl"] == self.broker_url(b):
                return b
        raise AssertionError(f"owner {r} of {topic} is none of {self.brokers}")

    def bundle(self, topic: str) -> str:
        path = topic.replace("persistent://", "persistent/")
        return self.admin("GET", f"/lookup/v2/topic/{path}/bundle").strip('"')

    def unload_topic(self, topic: str):
        self.admin("PUT", f"/admin/v2/{topic.replace('persistent://', 'persistent/')}/unload")

    def split_bundle(self, ns: str, bundle: str):
        self.admin("PUT", f"/admin/v2/namespaces/{ns}/{bundle}/split?unload=true")

    def unload_bundle(self, ns: str, bundle: str):
        self.admin("PUT", f"/admin/v2/namespaces/{ns}/{bundle}/unload")

    def kill9(self, node: str) -> float:
        """SIGKILL to the node's recorded pid (never by name); returns when it is gone."""
        pid = self.pid(node)
        assert pid, f"{node} is not running"
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert f"-Drigd.pulsar.node={node}".encode() in cmd, f"pid {pid} is not {node}"
        t = time.time()
        os.kill(pid, signal.SIGKILL)
        deadline = time.time() + 15
        while Path(f"/proc/{pid}").exists() and time.time() < deadline:
            try:
                if Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z"):
                    break
            except OSError:
                break
            time.sleep(0.05)
        return t

    def start(self, *nodes: str):
        self.sh("start", *nodes)
        self.refresh()

    def stop(self, *nodes: str):
        self.sh("stop", *nodes)
        self.refresh()


class DroppedConnections(LoopbackQdisc):
    """Every packet to or from the given local TCP ports on loopback dropped (an htb class with a
    1-byte drop-tail queue that u32 filters select): a client that dies behind it leaves its
    connection open at the broker, as a rig that loses power on a cellular link does."""

    def __init__(self, ports: list[int]):
        self.ports = ports

    def install(self):
        self.add_class("rate", "8kbit", leaf_limit=1)
        for p in self.ports:
            for field in ("sport", "dport"):
                self.add_filter(field, p)


def local_ports_of(pid: int, remote_ports: set[int]) -> list[int]:
    """Local ports of `pid`'s established TCP connections to any of `remote_ports` on 127.0.0.1."""
    out = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True, text=True, check=True).stdout
    ports = []
    for line in out.splitlines():
        if f"pid={pid}," not in line:
            continue
        parts = line.split()
        local, peer = parts[2], parts[3]
        if int(peer.rsplit(":", 1)[1]) in remote_ports:
            ports.append(int(local.rsplit(":", 1)[1]))
    return ports
