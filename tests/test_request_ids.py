"""Pure tests: a new request's readable id (what the UI's default list shows of a request) and its scoping."""

from __future__ import annotations

import re

import pytest

from toolloop._core.contracts import Actor
from toolloop._temporal.requests import REQUEST_ID, readable_request_id, request_id_of, request_workflow_id

U1 = Actor(user_id="u1", tenant_id="acme")


@pytest.mark.parametrize(
    ("question", "words"),
    [
        ("Where is my order A100?", "where-is-my-order-a100"),
        ("  Add a note to ticket T1001: Customer called", "add-a-note-to-ticket-t1001"),
        ("¿Dónde está mi pedido A100?", "donde-esta-mi-pedido-a100"),
        ("show my orders and ticket T1001 and free slots on 2026-12-01", "show-my-orders-and-ticket-t1001"),
        ("[click](javascript:alert(1)) **now**", "click-javascript-alert-1-now"),
    ],
)
def test_a_new_request_id_starts_with_the_questions_first_words(question: str, words: str) -> None:
    request_id = readable_request_id(question)
    assert re.fullmatch(rf"{words}-[0-9a-f]{{8}}", request_id), request_id
    assert REQUEST_ID.fullmatch(request_id)


def test_a_readable_id_is_bounded_and_new_each_time() -> None:
    question = "refund " * 10_000
    ids = {readable_request_id(question) for _ in range(50)}
    assert len(ids) == 50  # the same question never names the same run
    for request_id in ids:
        assert len(request_id) <= 49 and request_id.count("-") <= 6 and REQUEST_ID.fullmatch(request_id)


def test_long_or_mixed_tokens_never_enter_the_id() -> None:
    question = "my key sk-proj-9f8e7d6c5b4a39281706 password hunter2 hash deadbeefcafebabe0123 ok"
    request_id = readable_request_id(question)
    for secret in ("9f8e7d6c5b4a39281706", "hunter2", "deadbeefcafebabe0123"):
        assert secret not in request_id
    assert request_id.startswith("my-key-sk-proj-password-hash-")


@pytest.mark.parametrize("question", ["???", "日本語の質問", "x" * 100])
def test_a_question_without_short_plain_words_gets_a_random_id(question: str) -> None:
    assert re.fullmatch(r"[0-9a-f]{12}", readable_request_id(question))


def test_a_readable_id_names_one_workflow_per_tenant_and_user_and_reads_back() -> None:
    request_id = readable_request_id("Where is my order A100?")
    workflow_id = request_workflow_id(U1, request_id)
    assert workflow_id.startswith(f"ask-acme-u1-{request_id}-")
    assert request_id_of(U1, workflow_id) == request_id
    # Another user, or the same user id in another tenant, never names the same workflow with it.
    others = {request_workflow_id(Actor(user_id=u, tenant_id=t), request_id) for u, t in [("u2", "acme"), ("u1", "g")]}
    assert workflow_id not in others and len(others) == 2
    assert request_id_of(Actor(user_id="u2", tenant_id="acme"), workflow_id) == workflow_id
