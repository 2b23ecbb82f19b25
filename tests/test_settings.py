"""Pure: settings split by process. A worker's configuration cannot hold the approval signing key, and the
API's cannot hold the verify key or turn scripted models on: each process reads only what it is trusted with.
A bad value is one line naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT
from toolloop._temporal.settings import ApiSettings, WorkerSettings

SIGNING = {"approval_key"}
WORKER_TRUST = {"approval_verify_key", "allow_scripted_models"}


def test_a_worker_never_reads_the_signing_key_and_the_api_never_reads_a_workers_trust(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOOLLOOP_APPROVAL_KEY", "private")
    monkeypatch.setenv("TOOLLOOP_APPROVAL_VERIFY_KEY", "public")
    monkeypatch.setenv("TOOLLOOP_ALLOW_SCRIPTED_MODELS", "1")
    worker, api = WorkerSettings(), ApiSettings()
    assert SIGNING.isdisjoint(WorkerSettings.model_fields) and not hasattr(worker, "approval_key")
    assert WORKER_TRUST.isdisjoint(ApiSettings.model_fields)
    assert (worker.approval_verify_key, worker.allow_scripted_models) == ("public", True)
    assert api.approval_key is not None and api.approval_key.get_secret_value() == "private"


@pytest.mark.parametrize(
    ("entry", "variable"),
    [
        (["starter.py", "status"], "TOOLLOOP_API_PORT"),
        (["worker.py", "--tools", "demo.agent:build"], "TOOLLOOP_OTEL"),
        (["worker.py", "--tools", "demo.agent:build"], "TOOLLOOP_MODEL_PRICES"),
    ],
)
def test_a_bad_value_in_the_environment_is_one_line_and_exit_2(entry: list[str], variable: str) -> None:
    env = {**os.environ, variable: "not-a-value"}
    done = subprocess.run([sys.executable, *entry], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {variable}: ") and "not-a-value" in line, line
