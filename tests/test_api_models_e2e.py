"""End to end over real HTTP: the API process with named models (TOOLLOOP_MODELS) and a tokens file whose entries
list the models their callers may use, and a worker serving those models from a loopback OpenAI-compatible
server. A model a caller may not use is refused exactly as one that does not exist; an allowed one runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client

from devstack.processes import free_port
from tests.agent_helpers import assert_eventually
from tests.api_helpers import Api, assert_problem, running_api
from tests.conftest import APPROVAL_KEY, REPO_ROOT, BusinessService, TemporalServer
from tests.fake_openai_server import FakeOpenAIServer, output_message, responses_response

pytestmark = pytest.mark.e2e

SMALL_ONLY = {"Authorization": "Bearer token-of-u1-small-only-0001"}
EVERY_MODEL = {"Authorization": "Bearer token-of-u2-every-model-0002"}
NAMED = {"small": {"model": "small-model"}, "large": {"model": "large-model"}}
READ = "Where is my order A100?"


@pytest.fixture(scope="module")
async def fake_openai() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as server:
        yield server


@pytest.fixture(scope="module")
async def api(
    temporal_server: TemporalServer,
    business_service: BusinessService,
    client: Client,
    tmp_path_factory: Any,
    fake_openai: FakeOpenAIServer,
) -> AsyncIterator[Api]:
    tokens = Path(tmp_path_factory.mktemp("tokens")) / "tokens.json"
    tokens.write_text(
        json.dumps(
            {
                "tokens": [
                    {
                        "token": SMALL_ONLY["Authorization"][7:],
                        "tenant_id": "acme",
                        "user_id": "u1",
                        "models": ["small"],
                    },
                    {"token": EVERY_MODEL["Authorization"][7:], "tenant_id": "acme", "user_id": "u2"},
                ]
            }
        )
    )
    # The worker reads its models from its environment (the same TOOLLOOP_MODELS the API is given).
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TOOLLOOP_MODELS", json.dumps(NAMED))
        env.setenv("OPENAI_API_KEY", "sk-test-api-models-0123456789")
        env.setenv("OPENAI_BASE_URL", fake_openai.url)
        api_env = {"TOOLLOOP_API_TOKENS": str(tokens), "TOOLLOOP_MODELS": json.dumps(NAMED)}
        async with running_api(temporal_server, business_service, client, tmp_path_factory, env=api_env) as started:
            yield started


@pytest.fixture
async def http(api: Api) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api.url, timeout=30, trust_env=False) as c:
        yield c


async def _start(http: httpx.AsyncClient, headers: dict[str, str], model: str | None) -> httpx.Response:
    body = {"question": READ, **({"model": model} if model is not None else {})}
    return await http.post("/v1/requests", json=body, headers={**headers, "Idempotency-Key": uuid.uuid4().hex[:12]})


async def _finished(http: httpx.AsyncClient, request_id: str, headers: dict[str, str]) -> dict[str, Any]:
    found: dict[str, Any] = {}

    async def done() -> bool:
        found.update((await http.get(f"/v1/requests/{request_id}", headers=headers)).json())
        return found.get("status") not in (None, "running")

    await assert_eventually(done, within=60, what=f"request {request_id} finished")
    return found


async def test_a_model_the_caller_may_not_use_is_refused_as_if_it_did_not_exist(http: httpx.AsyncClient) -> None:
    forbidden = assert_problem(await _start(http, SMALL_ONLY, "large"), 422, "UNKNOWN_MODEL")
    unknown = assert_problem(await _start(http, SMALL_ONLY, "nosuch"), 422, "UNKNOWN_MODEL")
    assert forbidden["detail"] == "model: the worker has no model 'large' you may use; you may use small"
    # The same answer, field by field, once the name asked for is swapped: nothing tells "not yours" apart.
    assert json.loads(json.dumps(forbidden).replace("large", "nosuch")) == unknown
    assert forbidden["known_models"] == ["small"]
    # With a ":MODEL" too: that `large` is a named model is not this caller's to learn.
    named = assert_problem(await _start(http, SMALL_ONLY, "large:other-model"), 422, "UNKNOWN_MODEL")
    assert named == forbidden
    # The API's default (offline) is not this caller's: a request that names no model is refused, saying why.
    default = assert_problem(await _start(http, SMALL_ONLY, None), 422, "UNKNOWN_MODEL")
    assert default["detail"] == "model: this API's default model is not one you may use; name one: you may use small"


async def test_a_named_model_takes_no_model_of_its_own(http: httpx.AsyncClient) -> None:
    refused = assert_problem(await _start(http, EVERY_MODEL, "large:other-model"), 422, "UNKNOWN_MODEL")
    assert "'large' is a configured model" in refused["detail"] and "without ':MODEL'" in refused["detail"]
    assert refused["known_models"] == ["large", "offline", "script", "small"]


async def test_an_allowed_model_runs_on_its_configured_provider_model(
    http: httpx.AsyncClient, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.reply(responses_response(output_message("A100 ships today (small).")))
    started = await _start(http, SMALL_ONLY, "small")
    assert started.status_code == 201, started.text
    view = await _finished(http, started.json()["id"], SMALL_ONLY)
    assert (view["status"], view["final_text"]) == ("completed", "A100 ships today (small).")
    assert fake_openai.requests[-1].body["model"] == "small-model"

    fake_openai.reply(responses_response(output_message("A100 ships today (large).")))
    started = await _start(http, EVERY_MODEL, "large")
    assert started.status_code == 201, started.text
    view = await _finished(http, started.json()["id"], EVERY_MODEL)
    assert view["final_text"] == "A100 ships today (large)."
    assert fake_openai.requests[-1].body["model"] == "large-model"


async def test_me_lists_the_callers_models_and_the_default_only_when_it_is_theirs(http: httpx.AsyncClient) -> None:
    me = (await http.get("/v1/me", headers=SMALL_ONLY)).json()
    assert me == {"user_id": "u1", "tenant_id": "acme", "models": ["small"], "default_model": None, "roles": []}
    me = (await http.get("/v1/me", headers=EVERY_MODEL)).json()
    assert me["models"] == ["large", "offline", "script", "small"] and me["default_model"] == "offline"


def test_the_api_will_not_start_with_a_token_listing_a_model_the_workers_do_not_serve(
    temporal_server: TemporalServer, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.json"
    entry = {"token": "a-token-of-our-own-0001", "tenant_id": "acme", "user_id": "u1", "models": ["smal"]}
    tokens.write_text(json.dumps({"tokens": [entry]}))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TOOLLOOP_", "TEMPORAL_", "OPENAI_"))},
        "TEMPORAL_ADDRESS": temporal_server.address,
        "TOOLLOOP_APPROVAL_KEY": APPROVAL_KEY,
        "TOOLLOOP_API_TOKENS": str(tokens),
        "TOOLLOOP_API_MODELS": "offline",
        "TOOLLOOP_API_MODEL": "offline",
        "TOOLLOOP_MODELS": json.dumps(NAMED),
    }
    serve = [sys.executable, "starter.py", "serve", "--port", str(free_port())]
    refused = subprocess.run(serve, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().splitlines() == [
        "error: tokens file: the token of u1/acme names model 'smal', which is not among the worker's models "
        "(large, offline, small)"
    ]
    # Nor with a default that is a named model given a model of its own.
    env = {**env, "TOOLLOOP_API_TOKENS": str(REPO_ROOT / "config" / "api_tokens.json"), "TOOLLOOP_API_MODEL": "large:x"}
    env["TOOLLOOP_API_ALLOW_DEMO_TOKENS"] = "true"
    refused = subprocess.run(serve, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 2, refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("error: TOOLLOOP_API_MODEL 'large:x': 'large' is a configured model"), line
