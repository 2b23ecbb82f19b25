"""Static checks of Dockerfile and docker-compose.yml against the code (no container engine is needed)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from toolloop._core.names import USER_SEARCH_ATTRIBUTE
from toolloop._temporal.settings import Settings

REPO = Path(__file__).resolve().parents[1]
COMPOSE: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
DOCKERFILE = (REPO / "Dockerfile").read_text()
SETTINGS_ALIASES = {field.validation_alias for field in Settings.model_fields.values()}


def _env(service: str) -> dict[str, Any]:
    env = SERVICES[service].get("environment", {})
    return env if isinstance(env, dict) else dict(item.partition("=")[::2] for item in env)


def test_worker_env_names_are_settings_aliases_and_never_empty() -> None:
    env = _env("worker")
    assert {"TEMPORAL_ADDRESS", "TOOLLOOP_SERVICE_URL", "TOOLLOOP_TASK_QUEUE"} <= env.keys()
    assert set(env) <= SETTINGS_ALIASES
    # An empty string is a value to pydantic-settings (it would replace the default): pass through or set.
    assert all(value is None or (str(value) and not str(value).endswith(":-}")) for value in env.values())


def test_bizservice_env_names_are_read_by_the_service() -> None:
    source = (REPO / "demo" / "bizservice" / "__main__.py").read_text()
    names = set(_env("bizservice"))
    assert names
    assert all(f'"{name}"' in source and "os.environ" in source for name in names)


def test_worker_and_image_commands_run_existing_files() -> None:
    worker = SERVICES["worker"]
    assert worker["build"] == "."
    assert worker["command"][0] == "python" and (REPO / worker["command"][1]).is_file()
    cmd = json.loads(re.search(r"^CMD (.+)$", DOCKERFILE, re.MULTILINE).group(1))
    assert cmd[0] == "python" and (REPO / cmd[1]).is_file()


def test_dockerfile_copies_every_installed_module() -> None:
    copied = {src for line in re.findall(r"^COPY (.+) \S+$", DOCKERFILE, re.MULTILINE) for src in line.split()}
    assert all((REPO / src).exists() for src in copied)
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    needed = {f"{module}.py" for module in setuptools["py-modules"]}
    needed |= {pattern.rstrip("*") for pattern in setuptools["packages"]["find"]["include"]}
    assert needed | {"pyproject.toml"} <= copied
    assert re.search(r"^USER (?!root\b|0\b)\S+$", DOCKERFILE, re.MULTILINE)


def test_bizservice_command_uses_accepted_flags_and_the_worker_reaches_its_port() -> None:
    command = SERVICES["bizservice"]["command"]
    assert command[:3] == ["python", "-m", "demo.bizservice"]
    help_text = subprocess.run(
        [sys.executable, "-m", "demo.bizservice", "--help"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    accepted = set(re.findall(r"--[a-z][a-z-]*", help_text))
    used = [arg for arg in command[3:] if arg.startswith("--")]
    assert used and set(used) <= accepted
    port = command[command.index("--port") + 1]
    assert _env("worker")["TOOLLOOP_SERVICE_URL"] == f"http://bizservice:{port}"
    assert f":{port}/healthz" in " ".join(SERVICES["bizservice"]["healthcheck"]["test"])


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_service_image_is_pinned_and_dependencies_exist(name: str) -> None:
    service = SERVICES[name]
    assert "image" in service or "build" in service
    if "image" in service:
        tag = re.fullmatch(r"[\w./-]+:([\w][\w.-]*)", service["image"])
        assert tag and tag.group(1) != "latest", service["image"]
    assert set(service.get("depends_on", ())) <= set(SERVICES) - {name}


def test_temporal_uses_the_postgresql_service_credentials() -> None:
    temporal, postgres = _env("temporal"), _env("postgresql")
    assert temporal["DB"] == "postgres12" and temporal["POSTGRES_SEEDS"] == "postgresql"
    assert (temporal["POSTGRES_USER"], temporal["POSTGRES_PWD"]) == (
        postgres["POSTGRES_USER"],
        postgres["POSTGRES_PASSWORD"],
    )


def test_admin_tools_register_the_search_attribute_the_code_uses() -> None:
    script = " ".join(SERVICES["temporal-admin-tools"]["command"])
    assert f"search-attribute create --namespace default --name {USER_SEARCH_ATTRIBUTE} --type Keyword" in script
    assert "--address temporal:7233" in script


def test_no_container_holds_the_approval_signing_key_and_the_service_verifies() -> None:
    # The private key signs approvals: only the approval channel (on the host) has it.
    signers = {name for name in SERVICES if any(k.endswith("APPROVAL_KEY") for k in _env(name))}
    assert signers == set()
    verifiers = {name for name in SERVICES if any(k.endswith("APPROVAL_VERIFY_KEY") for k in _env(name))}
    assert verifiers == {"bizservice"}
