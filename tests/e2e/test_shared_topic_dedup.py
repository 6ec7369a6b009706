"""Issue 46.5, "nothing twice" without the broker's deduplication state on a topic shared by rigs
(docs/UPLINK.md, "Nothing twice"). Two rigs publish their serial source to one `{modality}` topic
with deduplication off on its namespace (what a broker that forgot the producers sees too: no
state, every SEND stored). The broker is frozen (SIGSTOP) while both publish, so frames of rig A
are written and never receipted; A is killed with -9, the broker thawed, rig B runs on (the
topic's last entry is B's from then on), and A restarts with a spool holding frames of unknown
fate. Before the fix A's probe read the topic's single last entry, found B's, gave up ("cannot
read the topic's last message") and sent them all again: duplicates. Now A reads the topic
forward from its last recorded receipt, its own entries only. Judged by the official Python
client: every seq of each rig exactly once."""

import collections
import time

import pulsar
import pytest

from harness import BROKER_URL, FrozenBroker, Rigd, assert_once_each, consume, namespace_without_dedup, unique



def config(rig: str, ns: str) -> str:
    return f"""
[rig]
id = "{rig}"

[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 200

[pulsar]
url = "{BROKER_URL}"
topic = "persistent://{ns}/{{modality}}"

[spool]
path = "spool"
mode = "always"
fsync-ms = 200

[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""


@pytest.mark.holds_broker
def test_a_rig_killed_on_a_topic_shared_with_another_sends_nothing_twice_without_dedup(broker, tmp_path):
    ns = namespace_without_dedup(unique("shared"))
    rigs = [unique("sa"), unique("sb")]
    a, b = (Rigd(tmp_path / r, config(r, ns)) for r in rigs)
    try:
        for d in (a, b):
            d.start()
        for d in (a, b):
            d.wait_for(lambda s: s["uplink"]["connected"] and s["uplink"]["published"] > 300, timeout=60,
                       what="publishing")
        # A second more: A's receipts of the last second are recorded (at most every second).
        time.sleep(1.5)
        with FrozenBroker():
            # Both windows fill with frames written and never receipted.
            time.sleep(2)
            a.kill9()
        # B runs on: the topic's last entry is B's whenever A looks.
        b.wait_for(lambda s: s["uplink"]["connected"], timeout=60, what="B connected again")
        time.sleep(1)
        a.start()
        held = a.status()["spool"]["records"]
        assert held > 0, "the premise: A's spool holds frames of unknown fate"
        a.wait_for(lambda s: s["uplink"]["connected"] and s["uplink"]["published"] > 0
                   and s["spool"]["records"] < 100, timeout=60, what="A's earlier frames judged and the rest sent")
        time.sleep(2)
        for d in (a, b):
            assert d.stop() == 0
        log = a.log()
    finally:
        for d in (a, b):
            d.close()
    msgs = consume(BROKER_URL, [f"persistent://{ns}/serial"], idle_timeout_s=6,
                   consumer_type=pulsar.ConsumerType.Exclusive)
    per = collections.defaultdict(list)
    for m in msgs:
        per[m["properties"]["rig"]].append(int(m["properties"]["seq"]))
    assert set(per) == set(rigs), sorted(per)
    for rig in rigs:
        assert_once_each(per[rig], rig)
    restart = log.split("rigd running")[-1]
    assert "read the topic forward from this producer's last recorded receipt" in restart, restart[-3000:]
    assert "cannot read the topic's last message" not in restart, restart[-3000:]
