"""Mutation testing: runs mutmut (configured in pyproject.toml, [tool.mutmut]) over the pure core, the
service's ledger and write path, and the workflow's write protocol, then prints what survived.

    .venv/bin/python -m tests.mutation            # everything (about half an hour on 2 cores)
    .venv/bin/python -m tests.mutation 'workflows.operations*'   # one module's mutants

The workflow tests need a Temporal dev server: this starts one and shares it with every test run (through
TOOLLOOP_TEST_TEMPORAL_ADDRESS), so each mutant costs its tests, not a server start. Results stay in
mutants/ (git-ignored): `.venv/bin/mutmut results` lists the survivors, `.venv/bin/mutmut show NAME` shows
one. README, "Mutation testing", has the last kill rate and why each survivor is harmless."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from devstack.processes import free_port, start_temporal_dev_server
from tests.conftest import REPO_ROOT, SHARED_TEMPORAL_ENV


def main(selection: list[str]) -> int:
    mutmut = str(Path(sys.executable).parent / "mutmut")
    with tempfile.TemporaryDirectory(prefix="toolloop-mutation-") as directory:
        port = free_port()
        server = start_temporal_dev_server(Path(directory), port, ui_port=None)
        try:
            env = {
                **os.environ,
                SHARED_TEMPORAL_ENV: f"127.0.0.1:{port}",
                # mutmut runs pytest inside its own process: the suite must not hard-exit at the end.
                "TOOLLOOP_NO_HARD_EXIT": "1",
            }
            # mutmut copies the sources it walks into mutants/ and does not follow links: toolloop/workflows and
            # toolloop/activities must link to the mutated copies of workflows/ and activities/ there, as they
            # link to the folders here, or the tests would import the unmutated code.
            for folder in ("workflows", "activities"):
                link = REPO_ROOT / "mutants" / "toolloop" / folder
                link.parent.mkdir(parents=True, exist_ok=True)
                if not link.is_symlink():
                    link.symlink_to(Path("..") / folder)
            run = subprocess.run(
                [mutmut, "run", "--max-children", "2", *selection], env=env, cwd=REPO_ROOT, check=False
            )
            subprocess.run([mutmut, "results"], env=env, cwd=REPO_ROOT, check=False)
            return run.returncode
        finally:
            server.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
