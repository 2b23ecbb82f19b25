"""End to end: the chaos runner notices what it exists to notice. Each test plants one bug in a copy of the
product code (the copy's `starter.py chaos` runs its own worker on it), runs the scenario that meets the bug
on a stack of its own, and expects a failed run (exit 1) that names the bug's figure in the headline and
puts it first, under "what broke". Without the bug the same scenarios hold every invariant
(tests/test_chaos_e2e.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.e2e

# What a chaos run needs of the repository: the product code and the demo it breaks.
PRODUCT = ("toolloop", "workflows", "activities", "demo", "devstack", "faultbed", "config", "starter.py", "worker.py")


@dataclass(frozen=True)
class Bug:
    name: str
    file: str
    # The code as it is, exactly once in the file, and the bug that replaces it.
    code: str
    bug: str
    scenario: str
    figure: str
    # More of the same bug elsewhere: (file, the code as it is, the bug).
    also: tuple[tuple[str, str, str], ...] = ()


BUGS = (
    Bug(
        "verified-without-read-back",
        "workflows/operations.py",
        "evidence = in_attempt or await self._read_back(op, result)",
        'evidence = in_attempt or Evidence(verified=True, detail="planted: never read back")',
        "svc-lost-reply",
        "verified without read-back",
    ),
    Bug(
        "429-after-commit-is-not-done",
        "toolloop/_tools/http.py",
        "    error = definite_refusal(status, body, codes)\n",
        "    if status == 429:\n"
        "        raise ToolError(ResultCode.TEMPORARY_UNAVAILABLE, 'planted: busy means not done')\n"
        "    error = definite_refusal(status, body, codes)\n",
        "svc-429-after-commit",
        "false not-done",
    ),
    Bug(
        "resend-with-a-new-key",
        "workflows/operations.py",
        "WriteInput(\n                    operation_id=op.operation_id,",
        "WriteInput(\n                    operation_id=op.operation_id + ('-again' if op.attempts > 1 else ''),",
        "svc-503-before-commit",
        "resends with a new key",
    ),
    Bug(
        "blind-resend-after-unknown",
        "workflows/operations.py",
        "            status = await self._resolve(op)\n            settled = self._settled_by_status(op, status)\n",
        # An unclear outcome taken for "not there" without asking the service.
        '            status, op.retention_seconds = OperationStatus(state="not_found"), 86400.0\n'
        "            settled = self._settled_by_status(op, status)\n",
        "svc-lost-reply",
        "blind resends",
    ),
    # Threads: a thread that starts each message's request without waiting for the one before it to end.
    Bug(
        "thread-messages-overlap",
        "workflows/thread.py",
        "            await self._run_message(inp, message, record)\n",
        '            __import__("asyncio").ensure_future(self._run_message(inp, message, record))\n',
        "thread-temporal-restart-queued",
        "overlapping messages",
    ),
    # ...and one that tells the later messages a write left unknown was verified.
    Bug(
        "thread-unknown-shown-done",
        "toolloop/_core/threads.py",
        "        state=state,\n",
        '        state="verified" if state == "unknown" else state,\n',
        "thread-unknown-reproposed",
        "writes shown done, not verified",
    ),
    # Policies: an evaluator that signs what its policy denied, and a workflow that sends it anyway...
    Bug(
        "denied-write-sent",
        "activities/policy.py",
        '        if record.verdict == "deny":\n            return PolicyDecision(record=record)\n',
        "",
        "policy-injected-refund",
        "effects a rule denied",
        also=(
            ("activities/policy.py", "            verdict=record.verdict,\n", '            verdict="allow",\n'),
            (
                "workflows/operations.py",
                '        if decision.record.verdict == "deny":\n',
                '        if decision.record.verdict == "deny" and decision.token is None:\n',
            ),
            (
                "workflows/operations.py",
                '        if decision.record.verdict == "allow":\n',
                '        if decision.record.verdict in ("allow", "deny"):\n',
            ),
        ),
    ),
    # ...and four eyes where the requester counts as the second person, on every side.
    Bug(
        "requester-counts-second",
        "toolloop/_core/contracts.py",
        "        return False  # the requester counts only as the first approval\n",
        "        pass  # planted: the requester counts as the second too\n",
        "policy-requester-second",
        "decisions by someone who may not decide",
        also=(
            (
                "toolloop/_core/approvals.py",
                "        if claims.approved_by == requester and people:\n            continue\n",
                "",
            ),
        ),
    ),
)


def planted_copy(root: Path, bug: Bug) -> Path:
    """The product code copied to `root`, with the bug in place of the code it replaces."""
    for name in PRODUCT:
        source = REPO_ROOT / name
        if source.is_dir():
            # symlinks=True: toolloop/workflows links to ../workflows, and must reach the copy's, with its bug.
            shutil.copytree(source, root / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, root / name)
    for file, code, planted in ((bug.file, bug.code, bug.bug), *bug.also):
        target = root / file
        text = target.read_text()
        # The code changed: this bug would plant nothing, so it must be written anew for the code of today.
        assert text.count(code) == 1, f"{bug.name}: the code it replaces is not in {file} exactly once"
        target.write_text(text.replace(code, planted))
    return root


@pytest.mark.parametrize("bug", BUGS, ids=[b.name for b in BUGS])
def test_a_planted_bug_fails_the_chaos_run_and_is_named_under_what_broke(tmp_path: Path, bug: Bug) -> None:
    root = planted_copy(tmp_path / "planted", bug)
    for attempt in range(2):
        out = tmp_path / f"results-{attempt}"
        done = subprocess.run(
            [sys.executable, str(root / "starter.py"), "chaos", "--scenarios", bug.scenario, "--out", str(out)]
            + (["--policies"] if bug.scenario.startswith("policy-") else []),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 1, done.stderr
        results = json.loads((out / "chaos.json").read_text())
        # A run that never reached the moment its scenario plans a fault for (a machine too busy for the
        # approval to be seen in time) judges nothing: it is run once more, never passed.
        if results["headline"]["fault points"] > 0:
            break
    assert results["headline"][bug.figure] == 1, (results["headline"], done.stderr)
    [run] = results["runs"]
    assert run["ok"] is False
    # What broke comes before the figures, on the terminal and in the report.
    err = done.stderr
    assert "what broke:\n" in err and err.index(f"  {bug.figure}: 1\n") < err.index("headline:\n"), err
    report = (out / "chaos.md").read_text()
    assert f"- **{bug.figure}: 1**" in report.split("## Headline", 1)[0]
