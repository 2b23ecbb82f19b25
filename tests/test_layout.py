"""Pure tests of the layout the library promises: the demo is built on the public API only, nothing in the
library imports the demo, workflow modules import only what is passed through the sandbox, and `import
toolloop` offers exactly its curated names."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import toolloop
import toolloop.servicekit
import toolloop.testing

REPO = Path(__file__).resolve().parent.parent
LIBRARY = ["toolloop", "workflows", "activities"]
ENTRY_POINTS_WITHOUT_DEMO = ["worker.py"]


def python_files(*roots: str) -> Iterator[Path]:
    for root in roots:
        path = REPO / root
        yield from [path] if path.is_file() else sorted(path.rglob("*.py"))


def imported_modules(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            modules.add(node.module)
    return modules


def test_the_demo_uses_only_public_toolloop_names() -> None:
    private = {
        f"{path.relative_to(REPO)}: {module}"
        for path in python_files("demo")
        for module in imported_modules(path)
        if module.startswith("toolloop.") and module not in ("toolloop.servicekit", "toolloop.testing")
    }
    assert private == set()


def test_no_library_module_imports_the_demo() -> None:
    offenders = {
        f"{path.relative_to(REPO)}: {module}"
        for path in python_files(*LIBRARY, *ENTRY_POINTS_WITHOUT_DEMO)
        for module in imported_modules(path)
        if module == "demo" or module.startswith("demo.")
    }
    assert offenders == set()


def test_the_library_names_no_demo_tool() -> None:
    demo_tools = ["get_order_status", "list_my_orders", "get_ticket", "find_free_slots", "append_ticket_note",
                  "create_calendar_event", "refund_order"]  # fmt: skip
    named = {
        f"{path.relative_to(REPO)}: {tool}"
        for path in python_files(*LIBRARY, *ENTRY_POINTS_WITHOUT_DEMO)
        for tool in demo_tools
        if tool in path.read_text()
    }
    assert named == set()


def test_the_public_api_is_exactly_its_curated_names() -> None:
    assert len(toolloop.__all__) == len(set(toolloop.__all__))
    for module in (toolloop, toolloop.servicekit, toolloop.testing):
        missing = [name for name in module.__all__ if not hasattr(module, name)]
        assert missing == [], module.__name__
    public = {name for name in dir(toolloop) if not name.startswith("_")}
    # Everything importable from toolloop that is not in __all__ is a subpackage, never a stray helper: the
    # service kit, the testing helpers, and the repository's workflows/ and activities/ folders, which the
    # library imports under its own name.
    assert public - set(toolloop.__all__) <= {"servicekit", "testing", "workflows", "activities"}


def test_the_wheel_claims_no_top_level_name_but_toolloop(tmp_path: Path) -> None:
    # A user's own `workflows`, `activities`, `demo` or `worker` must never collide with an installed toolloop.
    # Built from a copy (a build writes build/ and *.egg-info beside its sources), links kept as links.
    source = tmp_path / "source"
    for name in ("toolloop", "workflows", "activities"):
        shutil.copytree(REPO / name, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp_path / "dist"), str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("toolloop-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"toolloop", wheel.name.split("-py3")[0] + ".dist-info"}
    # The workflow and its activities are inside, under toolloop's name; the console script and the entry
    # points (starter.py, worker.py) are the repository's, not the wheel's.
    assert {"toolloop/workflows/agent.py", "toolloop/activities/model_turn.py"} <= set(names)
    assert not any(name.endswith("entry_points.txt") for name in names)


def test_import_toolloop_servicekit_imports_no_temporal_mcp_typer_or_psycopg() -> None:
    # A fresh interpreter: this one has imported everything already.
    probe = "import json, sys, toolloop.servicekit; print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    heavy = {"temporalio", "mcp", "typer", "httpx", "psycopg", "workflows", "activities"}
    assert heavy & set(json.loads(loaded.stdout)) == set()


def test_toolloop_imports_each_public_name_from_where_type_checkers_see_it() -> None:
    # The lazy table (toolloop._HOMES) and the `if TYPE_CHECKING:` imports name the same homes.
    seen: dict[str, str] = {}
    for node in ast.walk(ast.parse((REPO / "toolloop" / "__init__.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            seen |= {alias.name: node.module for alias in node.names}
    assert seen == toolloop._HOMES
    assert sorted(seen) == sorted(toolloop.__all__)
