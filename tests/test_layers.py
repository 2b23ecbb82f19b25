"""The import graph: every import points down the layers docs/DESIGN.md names, read from the source itself
(ast), so an arrow that points up fails here before it becomes a cycle or a dependency a user inherits."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO_ROOT

# Bottom to top (docs/DESIGN.md, "Layers"); the longest matching prefix decides a module's layer.
LAYERS: dict[str, int] = {
    # pure: contracts, validation, digests, tokens, planning
    "toolloop._core": 0,
    # adapters and tool sources, the service kit, and the Temporal basics the activities share
    "toolloop._models": 1,
    "toolloop._tools": 1,
    "toolloop._live": 1,
    "toolloop.servicekit": 1,
    "toolloop._temporal.converter": 1,
    "toolloop._temporal.search_attributes": 1,
    "toolloop._temporal.telemetry": 1,
    # the workflow and its activities (the folders workflows/ and activities/, imported as toolloop.workflows
    # and toolloop.activities: docs/DESIGN.md, "Layout")
    "toolloop.workflows": 2,
    "toolloop.activities": 2,
    # the face: the plugin and the client side, the HTTP API, the testing helpers, the public package
    "toolloop": 3,
    # the demo (its agent and business service) uses the library, nothing above it
    "demo": 4,
    # the entry points and the tooling around them
    "devstack": 5,
    "faultbed": 5,
    "bench": 5,
    "starter": 5,
    "worker": 5,
}
PRODUCT = ("toolloop", "workflows", "activities", "demo", "devstack", "faultbed", "bench", "starter.py", "worker.py")
# Folders at the repository's top that the library imports under its own name (toolloop/ links to them).
UNDER_TOOLLOOP = ("workflows", "activities")


def layer_of(module: str) -> tuple[str, int] | None:
    found = [(prefix, n) for prefix, n in LAYERS.items() if module == prefix or module.startswith(prefix + ".")]
    return max(found, key=lambda f: len(f[0])) if found else None


def imports() -> list[tuple[str, str]]:
    """(importing module, imported module) for every absolute import of the product's source."""
    found = []
    for name in PRODUCT:
        root = REPO_ROOT / name
        for path in [root] if root.is_file() else sorted(root.rglob("*.py")):
            module = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts).removesuffix(".__init__")
            if name in UNDER_TOOLLOOP:
                module = f"toolloop.{module}"
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    found += [(module, alias.name) for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    found.append((module, node.module))
    return found


def test_every_import_points_down_the_layers() -> None:
    upward = []
    for importer, imported in imports():
        mine, theirs = layer_of(importer), layer_of(imported)
        if mine is not None and theirs is not None and theirs[1] > mine[1]:
            upward.append(f"{importer} (layer {mine[1]}) imports {imported} (layer {theirs[1]})")
    assert upward == []


def test_the_demo_service_and_the_library_never_import_the_tooling_around_them() -> None:
    # The business service runs on its own: no test bed, no local stack, no benchmark, no Temporal.
    service = [(a, b) for a, b in imports() if a.startswith("demo.bizservice")]
    assert [b for _, b in service if b.split(".")[0] in ("faultbed", "devstack", "bench", "temporalio")] == []
    library = [(a, b) for a, b in imports() if a.split(".")[0] == "toolloop"]
    tooling = ("demo", "devstack", "faultbed", "bench", "starter", "worker")
    assert [(a, b) for a, b in library if b.split(".")[0] in tooling] == []


def test_the_layer_table_names_every_package_of_the_product() -> None:
    packages = {p.name for p in Path(REPO_ROOT).iterdir() if (p / "__init__.py").exists() and p.name != "tests"}
    packages = (packages - set(UNDER_TOOLLOOP)) | {"starter", "worker"}
    assert packages - {"examples"} <= {prefix.split(".")[0] for prefix in LAYERS}


def test_nothing_imports_the_workflow_or_activities_folders_by_their_top_level_names() -> None:
    # One module, one name: `workflows.agent` beside `toolloop.workflows.agent` would be two AgentWorkflow
    # classes, and an installed wheel has no top-level `workflows` at all.
    by_folder = [(a, b) for a, b in imports() if b.split(".")[0] in UNDER_TOOLLOOP]
    tests = [
        (str(path.relative_to(REPO_ROOT)), module)
        for path in sorted((REPO_ROOT / "tests").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        for module in (
            [alias.name for alias in node.names]
            if isinstance(node, ast.Import)
            else [node.module]
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
            else []
        )
        if module.split(".")[0] in UNDER_TOOLLOOP
    ]
    assert by_folder == [] and tests == []


def test_the_product_imports_no_private_module_of_another_package() -> None:
    # Public APIs only: `typer._click...` or `temporalio.worker._workflow_instance` is another package's inside,
    # free to change under us in any release.
    private = [
        (importer, imported)
        for importer, imported in imports()
        if imported.split(".")[0] not in ("toolloop", "__future__")
        and any(part.startswith("_") for part in imported.split("."))
    ]
    assert private == []
