"""The fault catalog's coverage table (faultbed/catalog.py) against docs/FAULTS.md and the test files: every
id has a scenario, a named test that exists, or a gap said plainly - and the report prints them all."""

from __future__ import annotations

import ast
import re

from faultbed.catalog import CATALOG_IDS, ELSEWHERE, CoveredByTest, Gap, coverage
from faultbed.report import catalog_rows
from faultbed.scenarios import BUILT_IN
from tests.conftest import REPO_ROOT


def catalog_ids_of_the_document() -> list[str]:
    return re.findall(r"^\| ([A-Z]\d+) \|", (REPO_ROOT / "docs" / "FAULTS.md").read_text(), re.M)


def test_the_table_lists_every_id_of_the_catalog_in_its_order() -> None:
    assert list(CATALOG_IDS) == catalog_ids_of_the_document()


def test_every_id_is_covered_by_a_scenario_or_named_elsewhere_never_both_never_neither() -> None:
    by_scenario = {case for s in BUILT_IN for case in s.covers}
    assert by_scenario <= set(CATALOG_IDS)
    for case in coverage():
        assert bool(case.scenarios) != (case.elsewhere is not None), case.case
    assert set(ELSEWHERE) == set(CATALOG_IDS) - by_scenario


def _test_functions(path: str) -> set[str]:
    tree = ast.parse((REPO_ROOT / path).read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_every_named_test_exists_and_every_reason_is_one_short_line() -> None:
    for case, covered in ELSEWHERE.items():
        if isinstance(covered, CoveredByTest):
            path, _, name = covered.node.partition("::")
            assert name.startswith("test_") and name in _test_functions(path), f"{case}: {covered.node}"
        assert isinstance(covered, CoveredByTest | Gap)
        assert covered.why and "\n" not in covered.why and len(covered.why) <= 120, case


def test_the_report_names_each_id_with_what_covers_it() -> None:
    chosen = [s for s in BUILT_IN if s.name in ("svc-lost-reply", "proc-worker-after-commit")]
    rows = {row[0]: row for row in catalog_rows(chosen)}
    assert list(rows) == list(CATALOG_IDS)
    assert rows["W2"][1:] == ["scenario proc-worker-after-commit", ""]
    assert rows["T8"][1:] == ["scenario svc-status-down, thread-unknown-reproposed", "(not in this run)"]
    assert rows["W8"][1] == "`tests/test_replay_histories.py::test_a_non_deterministic_change_fails_the_replay`"
    assert rows["Z3"][1:] == ["scenario wire-planted-admin-request", "(not in this run)"]
    assert not [row for row in rows.values() if row[1] == "**not covered yet**"]
    assert rows["C5"][1].startswith("`tests/test_writes_e2e.py::test_a_request_cancelled_while")


def test_the_chaos_document_lists_every_built_in_scenario_with_what_it_covers() -> None:
    text = (REPO_ROOT / "docs" / "CHAOS.md").read_text()
    rows = re.findall(r"^\| `([a-z0-9-]+)` \| ([A-Z0-9, ]+) \|", text, re.MULTILINE)
    assert sorted(rows) == sorted((s.name, ", ".join(s.covers)) for s in BUILT_IN)
