"""The notes service's tools, declared with toolloop's public API.

Run them on a worker: `python worker.py --tools examples.http_tools.tools:build` (NOTES_URL: the service;
NOTES_CALLER_KEY: the PEM private key that signs, for each call, a short-lived bearer token naming the session's
user, which the service verifies with its public half)."""

import os
import time
from collections.abc import Callable

import jwt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat
from pydantic import BaseModel, Field

import toolloop

CALLER_TOKEN_SECONDS = 60


class GetNote(toolloop.Arguments):
    note_id: int = Field(alias="noteId", ge=1, description="The note's id.")


class AddNote(toolloop.Arguments):
    text: toolloop.PlainText = Field(min_length=1, max_length=200, description="The note, plain text.")


class Note(BaseModel):
    note_id: int
    text: str


def caller_keys() -> tuple[str, str]:
    """A new key pair for the caller tokens, as PEM: (the worker's private key, the service's public key)."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode()
    return private, key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()


def bearer_for(signing_key: str, audience: str) -> Callable[[toolloop.Actor], dict[str, str]]:
    """How the session's user travels to the service: a bearer token, signed with the worker's key, for this
    service only, valid for a minute (made in the activity, for each call; never stored in history)."""

    def headers(actor: toolloop.Actor) -> dict[str, str]:
        now = int(time.time())
        claims = {"sub": actor.user_id, "tenant": actor.tenant_id, "aud": audience, "iat": now}
        token = jwt.encode({**claims, "exp": now + CALLER_TOKEN_SECONDS}, signing_key, algorithm="EdDSA")
        return {"Authorization": f"Bearer {token}"}

    return headers


def build() -> toolloop.Toolset:
    notes = toolloop.HttpSource(
        "notes",
        base_url=os.environ.get("NOTES_URL", "http://127.0.0.1:8800"),
        actor_headers=bearer_for(os.environ["NOTES_CALLER_KEY"], audience="notes"),
    )
    tools = toolloop.Toolset()
    tools.http_read(
        "get_note",
        source=notes,
        path="/notes/{noteId}",
        arguments=GetNote,
        result=Note,
        description="One of the current user's notes.",
        not_available="note {noteId} is not available",
    )
    tools.http_write(
        "add_note",
        source=notes,
        path="/notes",
        arguments=AddNote,
        result=Note,
        description="Add a note for the current user. Runs only after a person approves it.",
        read_back=toolloop.ReadBack(
            "/notes/{note_id}", Note, lambda args, created, found: {"text": found.text == args.text}
        ),
    )
    return tools
