"""Pure tests: canonical JSON, payload digests and operation ids. Their values are pinned: an approval in
flight is bound to a digest, and a workflow replayed by an upgraded worker derives its operation ids
again; a derivation that changed between deploys would resend an operation under a new key."""

from __future__ import annotations

import math

import pytest

from toolloop._core.approvals import canonical_json, derive_operation_id, payload_digest

NOTE = {"ticketId": "T1001", "text": "Caf\u00e9", "expectedVersion": 1}


def test_canonical_json_sorts_keys_has_no_spaces_and_keeps_unicode() -> None:
    assert canonical_json({"b": [1, "\u00e9"], "a": None}) == '{"a":null,"b":[1,"\u00e9"]}'
    assert canonical_json({"b": 1, "a": 2}) == canonical_json({"a": 2, "b": 1})


def test_canonical_json_refuses_what_json_cannot_carry() -> None:
    with pytest.raises(ValueError):
        canonical_json({"x": math.nan})


def test_the_payload_digest_is_pinned_and_covers_tool_and_arguments() -> None:
    digest = payload_digest("append_ticket_note", NOTE)
    assert digest == "sha256:7f70ff96a4a137fb2a88b1f3325b0db993be7fe45db0d2e80f3d2e6eac80a0fd"
    assert payload_digest("append_ticket_note", dict(reversed(NOTE.items()))) == digest
    assert payload_digest("refund_order", NOTE) != digest
    assert payload_digest("append_ticket_note", {**NOTE, "expectedVersion": 2}) != digest


def test_the_operation_id_is_pinned_and_scoped_to_request_tool_and_payload() -> None:
    op = derive_operation_id("ask-acme-u1-r1-abc", "append_ticket_note", NOTE)
    assert op == "op_0b8ab6327fd310cea017c27d8d364fb8"
    assert derive_operation_id("ask-acme-u1-r1-abc", "append_ticket_note", dict(reversed(NOTE.items()))) == op
    others = {
        derive_operation_id("ask-acme-u1-r2-abc", "append_ticket_note", NOTE),
        derive_operation_id("ask-acme-u1-r1-abc", "refund_order", NOTE),
        derive_operation_id("ask-acme-u1-r1-abc", "append_ticket_note", {**NOTE, "text": "Cafe"}),
    }
    assert op not in others and len(others) == 3
