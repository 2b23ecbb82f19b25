"""Tests: docs/UI.md describes the Temporal UI that the local stack's dev server bundles (its version, its
default columns), so the page is read again when the UI changes."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from devstack.processes import temporal_binary

REPO_ROOT = Path(__file__).resolve().parent.parent
UI_DOC = REPO_ROOT / "docs" / "UI.md"


def test_the_ui_page_describes_the_bundled_ui_version() -> None:
    version = subprocess.run([temporal_binary(), "--version"], capture_output=True, text=True, check=True, timeout=30)
    found = re.search(r"\bUI (\d+\.\d+)\.\d+", version.stdout)
    assert found is not None, version.stdout
    doc = UI_DOC.read_text()
    assert f"(UI {found[1]})" in doc.splitlines()[0], "docs/UI.md describes another UI version than the bundled one"
    assert version.stdout.strip() in doc
