"""toolloop.servicekit in a plain FastAPI service: a fresh venv with only the kit's own dependencies (pyproject's
`servicekit` extra, pip's cache and the package index as configured on this machine) and the repository's
`toolloop` folder on PYTHONPATH. temporalio, mcp and typer are not installed there; the kit imports, and a
service on a SQLite ledger takes an approved write once, replays it and answers its status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import APPROVAL_KEY, APPROVAL_VERIFY_KEY
from toolloop import Actor
from toolloop.testing import approval_token

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent
PIP_TIMEOUT_SECONDS = 240


@dataclass(frozen=True)
class KitVenv:
    python: Path
    env: dict[str, str]
    # Run from here, not the repository: `python -c` puts the working directory first on sys.path.
    cwd: Path

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.python), *args], env=self.env, cwd=self.cwd, capture_output=True, text=True, timeout=60
        )


def kit_requirements() -> list[str]:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    requirements: list[str] = extras["servicekit"]
    return requirements


@pytest.fixture(scope="module")
def kit_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KitVenv]:
    root = tmp_path_factory.mktemp("kit_venv")
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=120)
    python = root / "venv" / "bin" / "python"
    # pip's own settings (index, cache) come from the environment; this test's venv is not the one running it.
    pip_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", *kit_requirements()],
        env=pip_env,
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_SECONDS,
    )
    assert installed.returncode == 0, installed.stderr
    # Only the library's own folder: the repository's other top-level packages are not importable either.
    source = root / "src"
    source.mkdir()
    (source / "toolloop").symlink_to(REPO / "toolloop", target_is_directory=True)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(source), "PYTHONDONTWRITEBYTECODE": "1"}
    yield KitVenv(python=python, env=env, cwd=source)


def test_servicekit_imports_without_temporalio_mcp_or_typer(kit_venv: KitVenv) -> None:
    absent = kit_venv.run(
        "-c", "import importlib.util as u; print([m for m in ('temporalio', 'mcp', 'typer') if u.find_spec(m)])"
    )
    assert absent.stdout.strip() == "[]", absent.stderr

    imported = kit_venv.run("-c", "import toolloop.servicekit")

    assert imported.returncode == 0, imported.stderr


def test_a_service_on_the_kit_alone_writes_once_and_replays(kit_venv: KitVenv, tmp_path: Path) -> None:
    token = approval_token(
        APPROVAL_KEY,
        actor=Actor(user_id="u1", tenant_id="acme"),
        operation_id="op1",
        payload={"text": "written by a service that has only the kit"},
        path="/notes",
        audience="notes",
    )

    ran = kit_venv.run(str(REPO / "tests" / "kit_alone_app.py"), str(tmp_path / "kit.db"), APPROVAL_VERIFY_KEY, token)

    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout)
    answers = report["answers"]
    assert answers["no_key"]["code"] == "IDEMPOTENCY_KEY_REQUIRED"
    assert answers["no_token"]["code"] == "APPROVAL_REQUIRED"
    assert (answers["first"]["status"], answers["first"]["replayed"]) == (201, "")
    assert (answers["again"]["status"], answers["again"]["replayed"]) == (201, "true")
    assert answers["status"]["state"] == "completed"
    assert report["notes"] == [["op1", "u1", "written by a service that has only the kit"]]
    assert report["importable"] == []
    assert report["imported"] == []
