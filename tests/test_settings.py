"""Pure: settings split by process. A worker's configuration cannot hold the approval signing key, and the
API's cannot hold the verify key or turn scripted models on: each process reads only what it is trusted with."""

from __future__ import annotations

import pytest

from toolloop._temporal.settings import ApiSettings, Settings, WorkerSettings

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


def test_the_cli_which_runs_the_local_stack_reads_all_of_them() -> None:
    # It starts a worker and the API for the local stack, and is an approval channel itself.
    assert set(WorkerSettings.model_fields) | set(ApiSettings.model_fields) <= set(Settings.model_fields)
