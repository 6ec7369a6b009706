"""Partitioned topics (docs/UPLINK.md "Partitioned topics"): rigd routes a frame by its key (the
time bucket) as the official Java client routes a keyed message, for both hashing schemes; two
rigs share one topic; kill -9 and restart leave every seq once across the partitions; partitions
added while rigd runs get frames. Judged by the official Python client; the Java client publishes
the same keys for the comparison."""

import collections
import os
import subprocess
import time
from pathlib import Path

import pulsar
import pytest

from harness import BROKER_URL, ROOT, Rigd, admin, assert_once_each, consume, namespace_with_dedup, unique

JAVA_HOME = os.environ.get("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64")


def partitioned_topic(ns: str, name: str, partitions: int) -> str:
    admin("PUT", f"/admin/v2/persistent/{ns}/{name}/partitions", partitions)
    return f"persistent://{ns}/{name}"


def rig_config(rig: str, topic_template: str, scheme: str, mode: str = "on-outage") -> str:
    return f"""
[rig]
id = "{rig}"

[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 100

[pulsar]
url = "{BROKER_URL}"
topic = "{topic_template}"
hashing-scheme = "{scheme}"

[spool]
path = "spool"
mode = "{mode}"
fsync-ms = 20

[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""


def partition_of(msg) -> int:
    return int(msg["topic"].rsplit("-partition-", 1)[1])


def messages(topic: str, idle: float = 8):
    return consume(BROKER_URL, [topic], idle_timeout_s=idle, consumer_type=pulsar.ConsumerType.Shared)


def java_publish(tmp_path: Path, topic: str, scheme: str, keys: list[str]) -> None:
    lib = subprocess.run([str(ROOT / "tests/pulsar/broker.sh"), "fetch"], check=True, capture_output=True,
                         text=True).stdout.strip()
    out = tmp_path / "java"
    subprocess.run([f"{JAVA_HOME}/bin/javac", "-d", str(out), "-cp", f"{lib}/*",
                    str(ROOT / "tests/e2e/java/KeyedProducer.java")], check=True, timeout=120)
    subprocess.run([f"{JAVA_HOME}/bin/java", "-cp", f"{out}:{lib}/*", "KeyedProducer", BROKER_URL, topic, scheme,
                    *keys], check=True, timeout=120, capture_output=True)


def run_rigs(tmp_path: Path, configs: dict[str, str], secs: float) -> None:
    rigs = [Rigd(tmp_path / name, cfg) for name, cfg in configs.items()]
    try:
        for d in rigs:
            d.start()
        for d in rigs:
            d.wait_for(lambda s: s["uplink"]["connected"], timeout=60, what="uplink connected")
        time.sleep(secs)
        for d in rigs:
            assert d.stop() == 0
            assert "producing to the topic's partitions" in d.log(), d.log()[-3000:]
    finally:
        for d in rigs:
            d.close()


# One topic for both rigs: a topic per modality, or the source's id alone.
@pytest.mark.parametrize("scheme,template,name", [("murmur3-32", "{modality}", "serial"),
                                                  ("java-string", "shared-{source}", "shared-gps")])
def test_keys_land_on_the_partition_the_java_client_picks_and_two_rigs_share_the_topic(broker, tmp_path, scheme,
                                                                                       template, name):
    ns = namespace_with_dedup(unique("parts"))
    topic = partitioned_topic(ns, name, 4)
    rigs = [unique("rig-a"), unique("rig-b")]
    run_rigs(tmp_path, {r: rig_config(r, f"persistent://{ns}/{template}", scheme) for r in rigs}, 5)

    ours = messages(topic)
    by_rig = collections.defaultdict(list)
    where = collections.defaultdict(set)
    for m in ours:
        if m["properties"]["source"] == "gps":  # on the serial topic, the rigs' markers too
            by_rig[m["properties"]["rig"]].append(int(m["properties"]["seq"]))
        where[m["key"]].add(partition_of(m))
        assert m["properties"]["bucket"] == m["key"]
    for r in rigs:
        assert_once_each(by_rig[r], r)
        assert len(by_rig[r]) >= 300, (r, len(by_rig[r]))
    split = {k: p for k, p in where.items() if len(p) > 1}
    assert not split, f"keys on more than one partition: {list(split.items())[:5]}"
    used = collections.Counter(min(p) for p in where.values())
    assert len(used) == 4, f"keys used only partitions {sorted(used)}"

    # The Java client publishes the same keys with the same scheme: each lands where rigd put it.
    keys = sorted(where)
    java_publish(tmp_path, topic, scheme, keys)
    java = [m for m in messages(topic) if m["properties"].get("from") == "java"]
    assert sorted(m["key"] for m in java) == keys
    differ = [(m["key"], partition_of(m), sorted(where[m["key"]])) for m in java if {partition_of(m)} != where[m["key"]]]
    print(f"{scheme}: {len(keys)} keys on {dict(sorted(used.items()))}; rigd and Java differ on {len(differ)}")
    assert not differ, f"rigd and the Java client put keys on different partitions: {differ[:5]}"


def test_kill9_and_restart_on_a_partitioned_topic_sends_every_seq_once(broker, tmp_path):
    """`always` mode on a 3-partition topic with broker dedup: each partition has a producer of the
    same name, and each deduplicates its own sequence ids; kill -9 at arbitrary moments."""
    ns = namespace_with_dedup(unique("parts-kill"))
    rig = unique("kill")
    topic = partitioned_topic(ns, f"{rig}-gps", 3)
    d = Rigd(tmp_path, rig_config(rig, f"persistent://{ns}/{{rig}}-{{source}}", "murmur3-32", mode="always"))
    try:
        for secs in [2.5, 1.3, 3.1]:
            d.start()
            d.wait_for(lambda s: s["uplink"]["connected"], timeout=60, what="uplink connected")
            time.sleep(secs)
            d.kill9()
        d.start()
        d.wait_for(lambda s: s["uplink"]["connected"] and all(x["spooled_records"] < 50 for x in s["sources"]),
                   timeout=90, what="the earlier runs' records drained")
        time.sleep(2)
        assert d.stop() == 0
    finally:
        d.close()
    msgs = messages(topic)
    seqs = [int(m["properties"]["seq"]) for m in msgs]
    assert_once_each(seqs, "gps")
    assert len({partition_of(m) for m in msgs}) == 3
    # Per partition, in capture order (each partition's producer takes its frames in order).
    per = collections.defaultdict(list)
    for m in msgs:
        per[partition_of(m)].append(int(m["properties"]["seq"]))
    for p, s in per.items():
        assert s == sorted(s), f"partition {p} out of order"


def test_partitions_added_while_running_get_frames(broker, tmp_path):
    ns = namespace_with_dedup(unique("parts-grow"))
    rig = unique("grow")
    topic = partitioned_topic(ns, f"{rig}-gps", 2)
    d = Rigd(tmp_path, rig_config(rig, f"persistent://{ns}/{{rig}}-{{source}}", "murmur3-32"))
    try:
        d.start()
        d.wait_for(lambda s: s["uplink"]["connected"], timeout=60, what="uplink connected")
        time.sleep(2)
        admin("POST", f"/admin/v2/persistent/{ns}/{rig}-gps/partitions", 4)
        # Asked again every 60 s, as the Java client's autoUpdatePartitionsInterval.
        d.wait_for(lambda s: "partitions added to the topic" in d.log(), timeout=90, what="the new partitions seen")
        time.sleep(3)
        assert d.stop() == 0
    finally:
        d.close()
    msgs = messages(topic)
    assert_once_each([int(m["properties"]["seq"]) for m in msgs], "gps")
    assert {partition_of(m) for m in msgs} == {0, 1, 2, 3}
