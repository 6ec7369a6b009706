import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import BROKER_URL, ROOT  # noqa: E402


@pytest.fixture(scope="session")
def broker():
    """The shared real Pulsar broker of this run (tests/run.sh starts it; started here if not)."""
    if os.environ.get("RIGD_SKIP_BROKER") == "1":
        pytest.skip("RIGD_SKIP_BROKER=1")
    out = subprocess.run([str(ROOT / "tests/pulsar/broker.sh"), "start"], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"broker.sh start failed:\n{out.stderr[-4000:]}")
    return BROKER_URL
