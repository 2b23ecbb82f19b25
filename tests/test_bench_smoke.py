"""The benchmark script still runs end to end (tiny sizes; its numbers are not checked here)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.e2e


def test_request_cost_benchmark_runs_and_prints_ratios() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.request_cost", "--requests", "2", "--concurrency", "1"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[-1].startswith("ratio ours / baseline")
    assert len(lines[-1].split()) == 8  # label (4 words) + 4 ratios
