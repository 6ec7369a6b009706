"""A partition-count change across a crash (issue 46.1, docs/UPLINK.md "Partitioned topics"): frames
sent over 3 partitions and in flight when rigd was killed are judged, after the topic grew to 4,
on the partition they were sent to, not the one their key maps to now (and 4 -> 8: a frame stored
on its old partition is not sent again to the new, empty one its key maps to now). Before the fix, a frame in
flight landed on a partition whose last id was above it (acked unsent: lost) and a stored one on
the new, empty partition (sent twice: 187 of 7,392 seqs twice in the run the issue measured).
Judged by the official Python client: every seq exactly once across the partitions."""

import collections
import time

import pulsar
import pytest

from harness import BROKER_URL, FrozenBroker, Rigd, admin, assert_once_each, consume, namespace_with_dedup, unique


def config(rig: str, topic: str) -> str:
    return f"""
[rig]
id = "{rig}"

[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 200

[pulsar]
url = "{BROKER_URL}"
topic = "{topic}"

[spool]
path = "spool"
mode = "always"
fsync-ms = 20

[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""


def partition_of(msg) -> int:
    return int(msg["topic"].rsplit("-partition-", 1)[1])


@pytest.mark.holds_broker
@pytest.mark.parametrize("before,after", [(3, 4), (4, 8)])
def test_partitions_raised_after_a_crash_with_frames_in_flight_leave_every_seq_once(broker, tmp_path, before, after):
    ns = namespace_with_dedup(unique("pchange"))
    rig = unique("pc")
    name = f"{rig}-gps"
    admin("PUT", f"/admin/v2/persistent/{ns}/{name}/partitions", before)
    topic = f"persistent://{ns}/{name}"
    d = Rigd(tmp_path, config(rig, f"persistent://{ns}/{{rig}}-{{source}}"))
    try:
        d.start()
        d.wait_for(lambda s: s["uplink"]["connected"], timeout=60, what="uplink connected")
        time.sleep(4)
        with FrozenBroker():
            # Frames pile up in the partitions' windows, written and never receipted.
            time.sleep(3)
            d.kill9()
        admin("POST", f"/admin/v2/persistent/{ns}/{name}/partitions", after)
        d.start()
        d.wait_for(lambda s: s["uplink"]["connected"] and all(x["spooled_records"] < 50 for x in s["sources"]),
                   timeout=60, what="the earlier run's records drained")
        time.sleep(3)
        assert d.stop() == 0
        log = d.log()
    finally:
        d.close()
    msgs = consume(BROKER_URL, [topic], idle_timeout_s=8, consumer_type=pulsar.ConsumerType.Shared)
    seqs = [int(m["properties"]["seq"]) for m in msgs]
    per = collections.Counter(partition_of(m) for m in msgs)
    twice = sum(c - 1 for c in collections.Counter(seqs).values() if c > 1)
    print(f"{len(seqs)} messages, {len(set(seqs))} seqs, {twice} twice, per partition {dict(sorted(per.items()))}")
    assert_once_each(seqs, "gps")
    assert len(seqs) > 2000
    assert all(per[p] > 0 for p in range(before, after)), f"the restarted run's frames go over the {after} partitions"
    assert "partition count recorded" in log, log[-3000:]
