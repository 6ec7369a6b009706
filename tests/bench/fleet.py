#!/usr/bin/env python3
"""Fleet bench driver: N rigs x M sources through rigd's own producer (daemon/benches/fleet.rs)
against a real broker or cluster, with topic/bundle unloads (admin REST) and, on a cluster, a
broker kill -9 or a rolling restart of the brokers mid-run; judged by the official Python client.

    python3 tests/bench/fleet.py --rigs 250 [--rigs 500 ...] [--secs 60] [--unload-at 20,40]
        [--rate-scale 0.0333] [--url pulsar://127.0.0.1:6650] [--admin-url http://127.0.0.1:8080]
        [--bundles 4] [--kill-broker-at S [--kill-node owner|broker-N]] [--rolling-restart-at S
        [--restart-nodes broker-0,broker-1]] [--quick] [--json FILE]

One run per --rigs value (the sweep that shows where it bends). Each run gets a new namespace
`public/fleet-<time>-<rigs>` with broker deduplication on and `--bundles` bundles; topics are
`<ns>/rigNNNNN-<source>`, one per source. After the run every topic is read back from the
beginning with pulsar-client (one multi-topic Exclusive subscription): per topic, the `seq`
property of every message. Per source the bench reports how many frames it generated and how many
the broker acknowledged; the consumer decides:
  lost        an acknowledged seq (0..acked-1) that no message carries
  duplicated  messages beyond one per seq
  unconfirmed frames on the topic that were never acknowledged (left in flight at the end)
Re-establish time of an event = from the admin request (or the kill) until every producer is
connected again, from the bench's 10 ms connection watch.
On a cluster (--url and --admin-url may list several brokers, comma-separated) the judge and the
admin requests go only to brokers that accept a TCP connection at that moment: after a kill -9 the
dead one is left out (the official client would otherwise keep looking topics up there). A killed
node is started again (cluster.sh start NODE) once the run is judged.
Prints one markdown table; --json writes every run's figures and per-rig tallies.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "pulsar"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))


def reachable(hostport: str) -> bool:
    host, _, port = hostport.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        return True
    except OSError:
        return False


def live(urls: str) -> list[str]:
    """The entries of a comma-separated URL list ("pulsar://h1:p1,h2:p2" or "http://h1:p1,http://h2:p2")
    whose host:port accepts a TCP connection now, each a full URL; all of them if none does."""
    scheme, _, rest = urls.partition("://")
    entries = [e.split("://")[-1] for e in rest.split(",") if e]
    up = [e for e in entries if reachable(e.rstrip("/"))] or entries
    return [f"{scheme}://{e}" for e in up]


def live_service_url(url: str) -> str:
    scheme, _, _ = url.partition("://")
    return f"{scheme}://" + ",".join(u.partition("://")[2] for u in live(url))


def admin(bases: str, method: str, path: str, body=None, timeout: float = 120):
    base = live(bases)[0]
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def bench_binary() -> str:
    out = subprocess.run(["cargo", "bench", "--locked", "-q", "-p", "rigd", "--bench", "fleet", "--no-run",
                          "--message-format=json"], cwd=ROOT, capture_output=True, text=True, check=True)
    exes = [m["executable"] for m in map(json.loads, out.stdout.splitlines())
            if m.get("executable") and m.get("target", {}).get("name") == "fleet"]
    return exes[-1]


def cpu_s(pid: int | None) -> float | None:
    """CPU seconds (user + system) a process has used so far."""
    if not pid:
        return None
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    v = sorted(values)
    return v[min(len(v) - 1, int(len(v) * p))]


def consume_all(url: str, topics: list[str], expected: int, idle_s: float, total_s: float) -> dict[str, Counter]:
    """seq -> count per topic, read with the official client from the earliest message."""
    import pulsar
    client = pulsar.Client(url, operation_timeout_seconds=60, io_threads=2, message_listener_threads=1,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    seen: dict[str, Counter] = defaultdict(Counter)
    try:
        for attempt in range(3):
            # 1,000 topics right after a broker died: some lookups may still time out
            try:
                consumer = client.subscribe(topics, f"fleet-judge-{int(time.time())}",
                                            consumer_type=pulsar.ConsumerType.Exclusive,
                                            initial_position=pulsar.InitialPosition.Earliest,
                                            receiver_queue_size=200,
                                            max_total_receiver_queue_size_across_partitions=20000)
                break
            except pulsar.PulsarException as e:
                print(f"fleet:   judge subscribe failed ({e}), attempt {attempt + 1} of 3", file=sys.stderr)
                if attempt == 2:
                    raise
                time.sleep(10)
        got, deadline, last = 0, time.time() + total_s, time.time()
        while got < expected and time.time() < deadline:
            try:
                msg = consumer.receive(timeout_millis=1000)
            except pulsar.Timeout:
                if time.time() - last > idle_s:
                    break
                continue
            last = time.time()
            topic = msg.topic_name()
            seen[topic][int(msg.properties()["seq"])] += 1
            got += 1
            consumer.acknowledge(msg)
        # anything beyond `expected` (duplicates) arrives right behind: read until idle briefly
        while True:
            try:
                msg = consumer.receive(timeout_millis=2000)
            except pulsar.Timeout:
                break
            seen[msg.topic_name()][int(msg.properties()["seq"])] += 1
            consumer.acknowledge(msg)
        consumer.unsubscribe()
    finally:
        client.close()
    return seen


def rss_mib(pid: int | None) -> float | None:
    """A process's resident memory now, MiB."""
    if not pid:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def connections(pid: int) -> int:
    """Established TCP connections of process `pid` (the kernel's view, `ss`)."""
    out = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True, text=True).stdout
    return sum(f"pid={pid}," in line for line in out.splitlines())


def run_one(args, exe: str, rigs: int) -> dict:
    ns = f"public/fleet-{int(time.time())}-{rigs}"
    admin(args.admin_url, "PUT", f"/admin/v2/namespaces/{ns}", {"bundles": {"numBundles": args.bundles}})
    admin(args.admin_url, "POST", f"/admin/v2/namespaces/{ns}/deduplication", True)
    cmd = [exe, "--url", args.url, "--namespace", ns, "--rigs", str(rigs), "--secs", str(args.secs),
           "--rate-scale", str(args.rate_scale), "--drain-secs", str(args.drain_secs)]
    if args.profile:
        cmd += ["--profile", args.profile]
    if args.connection_per_producer:
        cmd += ["--connection-per-producer"]
    print(f"fleet: {rigs} rigs -> {ns}", file=sys.stderr)
    t_start = time.time()
    broker_cpu0 = cpu_s(args.broker_pid)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    lines: list[dict] = []
    ready = threading.Event()

    def reader():
        for line in proc.stdout:
            if line.startswith("{"):
                d = json.loads(line)
                lines.append(d)
                if d.get("event") == "ready":
                    ready.set()
                if d.get("event") == "down":
                    print(f"fleet:   down {d}", file=sys.stderr)
        ready.set()

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    ready.wait(timeout=600)
    ready_line = next((d for d in lines if d.get("event") == "ready"), None)
    if ready_line is None:
        proc.kill()
        raise SystemExit(f"fleet: {rigs} rigs: not every producer connected (bench exited {proc.wait()})")
    t_ready = ready_line["unix_ms"] / 1000
    conns = connections(proc.pid)
    print(f"fleet:   all {ready_line['producers']} producers connected in {ready_line['connect_all_s']:.1f} s "
          f"on {conns} connections", file=sys.stderr)
    broker_rss = rss_mib(args.broker_pid)
    actions = [("unload", t) for t in args.unload_at]
    if args.kill_broker_at is not None:
        actions.append(("kill", args.kill_broker_at))
    if args.rolling_restart_at is not None:
        actions.append(("rolling restart", args.rolling_restart_at))
    done_actions = []
    for what, at in sorted(actions, key=lambda a: a[1]):
        time.sleep(max(0.0, t_ready + at - time.time()))
        t0 = time.time()
        if what == "unload" and args.unload_scope == "bundle":
            # one bundle: only the producers whose topics hash into it move
            bundles = json.loads(admin(args.admin_url, "GET", f"/admin/v2/namespaces/{ns}/bundles"))["boundaries"]
            admin(args.admin_url, "PUT", f"/admin/v2/namespaces/{ns}/{bundles[0]}_{bundles[1]}/unload")
        elif what == "unload":
            admin(args.admin_url, "PUT", f"/admin/v2/namespaces/{ns}/unload")
        elif what == "rolling restart":
            # every broker in turn: SIGTERM (it unloads its bundles), then started again and
            # healthy before the next one goes, as an operator's rolling upgrade does
            # healthy before the next one goes, as an operator's rolling upgrade does. Each stop is
            # an event of its own (its producers move to the brokers still up).
            for node in args.restart_nodes:
                t_node = time.time()
                cluster().stop(node)
                stopped = time.time() - t_node
                cluster().start(node)
                done_actions.append({"what": f"restart {node}", "at_s": t_node - t_ready, "unix": t_node,
                                     "request_s": stopped})
                print(f"fleet:   restarted {node}: stopped in {stopped:.1f} s, up again at "
                      f"+{time.time() - t_ready:.1f} s", file=sys.stderr)
            continue
        else:
            node = args.kill_node if args.kill_node != "owner" else owner_node(ns)
            args.killed_node = node
            t0 = cluster().kill9(node)
            what = f"kill -9 {node}"
        done_actions.append({"what": what, "at_s": at, "unix": t0, "request_s": time.time() - t0})
        print(f"fleet:   {what} at +{at:.0f} s (request took {time.time() - t0:.2f} s)", file=sys.stderr)
    # the bench's own CPU, read just before it exits (its run and drain are over by then)
    bench_cpu = None
    while proc.poll() is None:
        bench_cpu = cpu_s(proc.pid) or bench_cpu
        broker_rss = max(filter(None, [broker_rss, rss_mib(args.broker_pid)]), default=None)
        time.sleep(0.5)
    run_s = time.time() - t_ready
    bench_wall = time.time() - t_start
    broker_cpu1 = cpu_s(args.broker_pid)
    rc = proc.wait()
    th.join(timeout=10)
    if rc != 0:
        raise SystemExit(f"fleet: bench exited {rc}")
    summary = next(d for d in lines if d.get("summary"))
    downs = [d for d in lines if d.get("event") == "down"]
    for a in done_actions:
        # the first stretch of disconnected producers that began after the action
        after = [d for d in downs if d["down_unix_ms"] >= a["unix"] * 1000 - 50]
        if after:
            d = after[0]
            offset = d["down_unix_ms"] / 1000 - a["unix"]  # the first close after the request
            a["all_up_after_s"] = round(d["up_unix_ms"] / 1000 - a["unix"], 3)
            a["unfinished"] = d["unfinished"]
            a["still_down"] = d["still_down"]
            a["went_down"] = d["went_down"]
            a["min_connected"] = d["min_connected"]
            a["reconnects"] = d["reconnects"]
            for q in ("p50", "p90", "p99"):
                a[f"back_{q}_s"] = round(d[f"back_{q}_s"] + offset, 3)
        else:
            a["all_up_after_s"] = None
    topics = [d for d in lines if "topic" in d and "generated" in d]
    expected = sum(t["acked"] + t["already"] for t in topics)
    t_consume = time.time()
    seen = consume_all(live_service_url(args.url), [t["topic"] for t in topics], expected,
                       idle_s=args.consume_idle_s, total_s=max(300.0, expected / 2000))
    consume_s = time.time() - t_consume
    if getattr(args, "killed_node", None):
        cluster().start(args.killed_node)
        print(f"fleet:   {args.killed_node} started again", file=sys.stderr)
    if not args.keep:
        # The next run of a sweep must not share the broker with this run's idle topics: unloaded,
        # they stay stored but cost the broker nothing (deleting a namespace with topics needs
        # forceDeleteNamespaceAllowed, off by default).
        try:
            admin(args.admin_url, "PUT", f"/admin/v2/namespaces/{ns}/unload", timeout=300)
        except (urllib.error.URLError, OSError) as e:
            print(f"fleet:   could not unload {ns}: {e}", file=sys.stderr)
    per_rig: dict[str, dict] = defaultdict(lambda: Counter())
    for t in topics:
        got = seen.get(t["topic"], Counter())
        confirmed = t["acked"] + t["already"]
        lost = sum(1 for s in range(confirmed) if got[s] == 0)
        dup = sum(c - 1 for c in got.values() if c > 1)
        unconfirmed = sum(1 for s in got if s >= confirmed)
        r = per_rig[t["rig"]]
        r["generated"] += t["generated"]
        r["acked"] += confirmed
        r["delivered"] += len(got)
        r["lost"] += lost
        r["duplicated"] += dup
        r["unconfirmed"] += unconfirmed
        r["left"] += t["left"]
    totals = Counter()
    for r in per_rig.values():
        totals.update(r)
    rigs_with_loss = sum(1 for r in per_rig.values() if r["lost"])
    rigs_with_dup = sum(1 for r in per_rig.values() if r["duplicated"])
    return {
        "rigs": rigs, "namespace": ns, "bundles": args.bundles, "unload_scope": args.unload_scope, "wall_s": round(time.time() - t_start, 1),
        "ready": ready_line, "summary": summary, "events": done_actions, "downs": downs,
        "totals": dict(totals), "rigs_with_loss": rigs_with_loss, "rigs_with_dup": rigs_with_dup,
        "consume_s": round(consume_s, 1), "connections": conns,
        "broker_rss_mib_max": None if broker_rss is None else round(broker_rss),
        "bench_cpu_pct": None if bench_cpu is None else round(100 * bench_cpu / bench_wall, 1),
        "broker_cpu_pct": None if broker_cpu0 is None or broker_cpu1 is None
        else round(100 * (broker_cpu1 - broker_cpu0) / (run_s + ready_line["connect_all_s"]), 1), "per_rig": {k: dict(v) for k, v in per_rig.items()},
    }


def cluster():
    """The cluster.sh cluster (tests/e2e/cluster_harness.py), for its nodes' pids: a node is killed,
    stopped and started only by the pid cluster.sh recorded for it, checked against its command line."""
    global _cluster
    if _cluster is None:
        from cluster_harness import Cluster
        _cluster = Cluster()
    return _cluster


_cluster = None


def owner_node(ns: str) -> str:
    """The broker node that owns most of NS's bundles now."""
    c = cluster()
    counts = {}
    for node in c.live_brokers():
        broker_id = c.admin_url(node).split("://")[-1].rstrip("/")
        owned = c.admin("GET", f"/admin/v2/brokers/{c.vars['PULSAR_CLUSTER_NAME']}/{broker_id}/ownedNamespaces",
                        broker=node)
        counts[node] = sum(1 for k in owned if k.startswith(ns + "/"))
    if not counts:
        raise SystemExit("fleet: no broker of the cluster runs")
    node = max(counts, key=counts.get)
    print(f"fleet:   bundles of {ns} per broker: {counts}; killing {node}", file=sys.stderr)
    return node


def event_text(e: dict) -> str:
    head = f"{e['what']} +{e['at_s']:.0f}s"
    if e.get("all_up_after_s") is None:
        return f"{head}: no producer went down"
    spread = f"{e['back_p50_s']:.1f} / {e['back_p90_s']:.1f} / {e['back_p99_s']:.1f}"
    if e["unfinished"]:
        return f"{head}: {e['went_down']} down; {spread} / {e['still_down']} still down after {e['all_up_after_s']:.1f} s"
    return f"{head}: {e['went_down']} down; {spread} / {e['all_up_after_s']:.1f} s"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=os.environ.get("PULSAR_URL", "pulsar://127.0.0.1:6650"))
    ap.add_argument("--admin-url", default=os.environ.get("PULSAR_ADMIN_URL", "http://127.0.0.1:8080"))
    ap.add_argument("--rigs", type=int, action="append", help="rigs per run (repeat for a sweep)")
    ap.add_argument("--profile", help="NAME:HZ:BYTES,... per rig (default: the bench's rig)")
    ap.add_argument("--rate-scale", type=float, default=1 / 30)
    ap.add_argument("--secs", type=float, default=60)
    ap.add_argument("--drain-secs", type=float, default=60)
    ap.add_argument("--unload-at", default="20,40", help="namespace unloads, seconds after all are connected")
    ap.add_argument("--bundles", type=int, default=4)
    ap.add_argument("--unload-scope", choices=["namespace", "bundle"], default="namespace",
                    help="unload every bundle of the namespace, or only its first bundle")
    ap.add_argument("--kill-broker-at", type=float, help="kill -9 --kill-node then (cluster)")
    ap.add_argument("--kill-node", default="owner",
                    help="the cluster.sh node to kill -9 (default: the broker owning most of the run's bundles)")
    ap.add_argument("--rolling-restart-at", type=float,
                    help="restart every --restart-nodes broker in turn then (cluster.sh stop/start; cluster)")
    ap.add_argument("--restart-nodes", default="broker-0,broker-1")
    ap.add_argument("--broker-pid", type=int, default=int(os.environ.get("PULSAR_BROKER_PID") or 0) or None,
                    help="the broker's JVM, for its CPU use (standalone; default $PULSAR_BROKER_PID)")
    ap.add_argument("--consume-idle-s", type=float, default=15)
    ap.add_argument("--quick", action="store_true", help="one short run: 50 rigs x 4 sources, 8 s, one unload at +2 s")
    ap.add_argument("--json", help="write every run's figures here")
    ap.add_argument("--connection-per-producer", action="store_true",
                    help="each producer on a connection of its own (rigd before it shared one per broker)")
    ap.add_argument("--keep", action="store_true", help="keep each run's topics loaded (unloaded by default)")
    ap.add_argument("--bench", help="the fleet bench binary (default: built with cargo bench --no-run)")
    args = ap.parse_args()
    if args.quick:
        args.rigs = args.rigs or [50]
        args.secs, args.unload_at, args.drain_secs, args.consume_idle_s = 8, "2", 15, 5
    args.rigs = args.rigs or [250]
    args.unload_at = [float(x) for x in args.unload_at.split(",") if x]
    args.restart_nodes = [x for x in args.restart_nodes.split(",") if x]
    exe = args.bench or bench_binary()
    runs = [run_one(args, exe, rigs) for rigs in args.rigs]
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(runs, indent=1))
    print("| rigs | producers | offered msg/s | offered MB/s | connect all | generated | acked | delivered | lost | duplicated | left "
          "| capture-to-receipt p50 / p99 / p99.99 ms, steady | same, whole run (max) | events: producers back after (p50 / p90 / p99 / all) | CPU bench / broker "
          "| connections | broker RSS max |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        s, t = r["summary"], r["totals"]
        ev = "; ".join(event_text(e) for e in r["events"]) or "none"
        print(f"| {r['rigs']} | {s['producers']} | {s['offered_msg_per_s']:.0f} | {s['offered_mb_per_s']:.1f} | "
              f"{r['ready']['connect_all_s']:.1f} s | {s['generated']} | {s['acked'] + s['already']} | {t.get('delivered', 0)} | "
              f"{t.get('lost', 0)} ({r['rigs_with_loss']} rigs) | {t.get('duplicated', 0)} ({r['rigs_with_dup']} rigs) | {s['left']} | "
              f"{s['steady_p50_ms']:.1f} / {s['steady_p99_ms']:.1f} / {s['steady_p9999_ms']:.1f} | "
              f"{s['capture_p50_ms']:.1f} / {s['capture_p99_ms']:.1f} / {s['capture_p9999_ms']:.1f} ({s['capture_max_ms']:.0f}) | {ev} | "
              f"{r['bench_cpu_pct']} % / {r['broker_cpu_pct']} % | {r['connections']} | {r['broker_rss_mib_max']} MiB |")
    bad = sum(r["totals"].get("lost", 0) + r["totals"].get("duplicated", 0) for r in runs)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
