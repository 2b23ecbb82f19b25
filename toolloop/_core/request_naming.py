"""Pure: how requests and threads are named - their workflow ids, scoped by tenant and user, and what the UI
shows of them. The client starts requests under these names, and a thread's workflow starts its messages'
requests under the same ones, so a request id means the same whoever started it."""

from __future__ import annotations

import hashlib
import json
import re

from toolloop._core.text import markdown_literal

REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# A thread id is spelled like a request id.
THREAD_ID = REQUEST_ID


def _scope(tenant_id: str, user_id: str, name: str) -> str:
    return hashlib.sha256(json.dumps([tenant_id, user_id, name]).encode()).hexdigest()[:12]


def request_workflow_id(tenant_id: str, user_id: str, request_id: str) -> str:
    """The workflow id of a user's request id: readable, and scoped by tenant and user (the hash covers the
    exact triple, so no other user or tenant can ever name the same workflow)."""
    return f"ask-{tenant_id}-{user_id}-{request_id}-{_scope(tenant_id, user_id, request_id)}"


def thread_workflow_id(tenant_id: str, user_id: str, thread_id: str) -> str:
    """The workflow id of a user's thread: scoped like a request's (another user's thread id names another
    workflow), and never a request's ("thread" is part of what the hash covers)."""
    return f"thread-{tenant_id}-{user_id}-{thread_id}-{_scope(tenant_id, user_id, 'thread:' + thread_id)}"


def request_memo(request_id: str, question: str, *, submission: str) -> dict[str, str]:
    """What toolloop records with a request, so the API's list shows it whoever started it: its id, the start
    of its question, and the digest of what was submitted (what its request id is bound to)."""
    return {"request_id": request_id, "question": question[:200], "submission": submission}


def request_summary(user_id: str, tenant_id: str, question: str) -> str:
    """The workflow's summary in the UI: who asked what (shortened). The UI renders it as Markdown, so the
    question is escaped to show as the text it is."""
    one_line = " ".join(question.split())
    shortened = one_line[:100] + ("…" if len(one_line) > 100 else "")
    return f"{user_id}@{tenant_id}: {markdown_literal(shortened)}"
