"""Pure: the facts a write's policy decides on come from the request's own earlier reads (toolloop/_core/facts.py)."""

from __future__ import annotations

from toolloop._core.contracts import PolicyFact
from toolloop._core.facts import Read, policy_facts, unchanged_by

INVOICE = PolicyFact(name="invoice", tool="get_invoice", match={"invoiceId": "invoiceId"}, fields=["open", "payee"])


def _read(invoice: str, open_cents: int, ok: bool = True, **extra: object) -> Read:
    return Read("get_invoice", {"invoiceId": invoice}, {"ok": ok, "open": open_cents, "payee": "acct-1", **extra})


def test_the_newest_matching_read_gives_the_fact_with_only_its_fields() -> None:
    reads = [_read("I1", 900, secret="x"), _read("I2", 50), _read("I1", 700, secret="y")]
    assert policy_facts([INVOICE], {"invoiceId": "I1"}, reads) == {"invoice": {"open": 700, "payee": "acct-1"}}


def test_a_fact_not_read_or_read_as_an_error_or_by_another_tool_is_absent() -> None:
    other = Read("get_order", {"invoiceId": "I1"}, {"ok": True, "open": 1, "payee": "p"})
    failed = _read("I1", 900, ok=False)
    assert policy_facts([INVOICE], {"invoiceId": "I1"}, [other, failed, _read("I2", 5)]) == {}
    assert policy_facts([INVOICE], {}, [_read("I1", 5)]) == {}  # the write names no invoice


def test_a_write_sent_outdates_the_reads_its_facts_came_from_and_only_those() -> None:
    reads = [_read("I1", 900), _read("I2", 50), Read("get_payee", {"invoiceId": "I1"}, {"ok": True})]
    assert unchanged_by([([INVOICE], {"invoiceId": "I1", "cents": 100})], reads) == reads[1:]
    assert unchanged_by([], reads) == reads


def test_a_write_whose_tool_names_no_facts_may_have_changed_anything_read() -> None:
    # Nothing says what such a write changes (a cancellation, an MCP write): no earlier read is a fact after it,
    # so a rule that needs one cannot allow until the request reads again.
    reads = [_read("I1", 900), Read("get_payee", {"invoiceId": "I1"}, {"ok": True})]
    assert unchanged_by([([], {"ticketId": "T1"})], reads) == []
    assert unchanged_by([([INVOICE], {"invoiceId": "I9"}), ([], {})], reads) == []
