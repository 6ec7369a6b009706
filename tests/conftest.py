import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _own_broker_env() -> bool:
    """In a lane of tests/lanes.py whose tests hold their broker alone (RIGD_OWN_BROKER_PORT_BASE set),
    each pytest-xdist worker gets a broker of its own (`lanes.own_broker_env`: its data dir and ports).
    Set before harness is imported, which reads PULSAR_URL."""
    base = os.environ.get("RIGD_OWN_BROKER_PORT_BASE")
    if not base:
        return False
    from lanes import own_broker_env
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    os.environ.update(own_broker_env(int(base), os.environ["RIGD_OWN_BROKER_DATA"], worker))
    return True


OWN_BROKER = _own_broker_env()

from harness import BROKER_URL, ROOT  # noqa: E402

MARKERS = {
    "holds_broker": "stops, freezes, restarts or shapes its broker: runs where each worker has a broker of "
                    "its own (tests/lanes.py lane `own-broker`), never beside tests on the shared one",
    "vm": "boots a QEMU guest (CPU-bound TCG): the `vm` lane runs one at a time",
    "cluster": "needs the multi-node cluster of tests/pulsar/cluster.sh (the `cluster` lane)",
    "arm64": "boots the aarch64 guest with the cross-built .deb (the `arm64` lane, only when RIGD_LANES names it)",
    "alone": "measures rigd against a shaped link's capacity with a broker of its own: the `alone` lane, after "
             "every other lane (a loaded host's late receipts read as the link's queue)",
}


def pytest_configure(config):
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


@pytest.fixture(scope="session")
def broker():
    """This run's real Pulsar broker: the shared one (tests/run.sh starts it; started here if not), or
    in an own-broker lane this worker's own, started on first use and stopped when the worker ends."""
    if os.environ.get("RIGD_SKIP_BROKER") == "1":
        pytest.skip("RIGD_SKIP_BROKER=1")
    sh = str(ROOT / "tests/pulsar/broker.sh")
    out = subprocess.run([sh, "start"], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"broker.sh start failed:\n{out.stderr[-4000:]}")
    yield BROKER_URL
    if OWN_BROKER:
        subprocess.run([sh, "stop"], capture_output=True, text=True)


def test_id(config, nodeid: str) -> str:
    """A test's id from the repository root (tests/e2e/test_x.py::name[param]), whatever the rootdir."""
    path, _, rest = nodeid.partition("::")
    if rest.rfind("@") > rest.rfind("]"):
        rest = rest[:rest.rfind("@")]  # the xdist group's suffix (_xdist_group_ids)
    p = (config.rootpath / path).resolve()
    return f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}::{rest}"


def _xdist_group_ids(config, items):
    """`--dist loadgroup` on a worker: a grouped test's node id ends with `@<group>`, the one way
    pytest-xdist 3.8 tells its scheduler the group. xdist sets it through `item._nodeid`, which
    pytest 9.2's structured node ids no longer read (pytest-dev/pytest-xdist#1386): every
    `xdist_group` was then spread over the workers (test_thin_link and test_auto_bandwidth's
    heavy-link on gw0 and gw1 side by side). Set here where xdist's did not take."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        names = {str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                 for m in item.iter_markers("xdist_group")}
        suffix = "@" + "_".join(sorted(names))
        if not names or item.nodeid.endswith(suffix):
            continue
        if hasattr(item, "_id"):
            from _pytest.nodeid import coerce_node_id
            item._id = coerce_node_id(item.nodeid + suffix)
        else:
            item._nodeid = item.nodeid + suffix


@pytest.hookimpl(trylast=True)  # after xdist's own (WorkerInteractor), to see whether it took
def pytest_collection_modifyitems(config, items):
    """Longest first, by tests/durations.json (a test it does not know counts as long, so a new one
    never waits at the back): lanes of many workers end together. A pytest-xdist group stays whole, in
    its own order, placed by its total."""
    _xdist_group_ids(config, items)
    path = ROOT / "tests" / "durations.json"
    if not path.exists():
        return
    known = json.loads(path.read_text())

    def unit(item):
        group = item.get_closest_marker("xdist_group")
        return f"group:{group.args[0] if group.args else group.kwargs.get('name')}" if group else item.nodeid

    total: dict[str, float] = {}
    for item in items:
        total[unit(item)] = total.get(unit(item), 0.0) + known.get(test_id(config, item.nodeid), 120.0)
    items.sort(key=lambda item: -total[unit(item)])


_RESULTS: dict[str, dict] = {}


def pytest_runtest_logreport(report):
    """Each test's time (setup + call + teardown) and outcome, kept where the run is reported from
    (the xdist controller, or pytest alone) for tests/lanes.py (RIGD_LANE_RESULTS)."""
    r = _RESULTS.setdefault(report.nodeid, {"seconds": 0.0, "outcome": "passed"})
    r["seconds"] += report.duration
    if report.failed:
        r["outcome"] = "failed"
    elif report.skipped and r["outcome"] == "passed":
        r["outcome"] = "skipped"


def pytest_sessionfinish(session):
    out = os.environ.get("RIGD_LANE_RESULTS")
    if out and not hasattr(session.config, "workerinput"):
        results = {test_id(session.config, k): v for k, v in _RESULTS.items()}
        Path(out).write_text(json.dumps(results, indent=1) + "\n")
