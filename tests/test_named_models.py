"""Named models (TOOLLOOP_MODELS): the worker's settings read the table and refuse a bad one at start in one line
that names the variable and shows no secret; each entry inherits the OPENAI_* settings it does not set; the
adapter a name builds asks its endpoint for its configured model and for no other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from devstack.stack import LocalStack, StackSecrets, demo_model_names
from tests.conftest import REPO_ROOT
from tests.fake_openai_server import FakeOpenAIServer, chat_completion, output_message, responses_response
from toolloop._core.approvals import generate_signing_key
from toolloop._core.contracts import Actor, MessageItem, ModelSpec, user_message
from toolloop._core.named_models import named_model_refusal, named_models
from toolloop._models.adapter import ModelRequest
from toolloop._models.errors import ModelCallError
from toolloop._temporal.settings import Settings, WorkerSettings, settings_error
from toolloop._temporal.worker_factory import NamedModel, check_model_names_free, settings_models

KEY = "sk-test-named-models-0123456789"
LARGE_KEY = "sk-test-large-model-9876543210"


def _settings(table: object, **env: str) -> WorkerSettings:
    return WorkerSettings.model_validate({"TOOLLOOP_MODELS": json.dumps(table), **env})


def _error(table: object | str, **env: str) -> str:
    text = table if isinstance(table, str) else json.dumps(table)
    with pytest.raises(ValidationError) as caught:
        WorkerSettings.model_validate({"TOOLLOOP_MODELS": text, **env})
    return settings_error(caught.value)


@pytest.fixture
async def server() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as running:
        yield running


def test_each_named_model_inherits_the_openai_settings_it_does_not_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LARGE_API_KEY", LARGE_KEY)
    monkeypatch.setenv("LARGE_HEADERS", '{"X-Large": "large-header-value"}')
    settings = _settings(
        {
            "small": {"model": "gpt-4.1-mini"},
            "large": {
                "model": "gpt-4.1",
                "api": "chat",
                "base_url": "http://127.0.0.1:9/v1",
                "api_key_env": "LARGE_API_KEY",
                "extra_headers_env": "LARGE_HEADERS",
                "timeout_seconds": 60,
            },
        },
        OPENAI_API_KEY=KEY,
        OPENAI_BASE_URL="https://gateway.example/v1",
        OPENAI_EXTRA_HEADERS='{"X-Gateway": "gateway-header-value"}',
        OPENAI_TIMEOUT_SECONDS="30",
    )
    endpoints = settings.model_endpoints()
    assert sorted(endpoints) == ["large", "openai", "small"]
    small, large = endpoints["small"], endpoints["large"]
    assert (small.api, small.base_url, small.model, small.timeout_seconds) == (
        "responses",
        "https://gateway.example/v1",
        "gpt-4.1-mini",
        30.0,
    )
    assert small.api_key.get_secret_value() == KEY
    assert {k: v.get_secret_value() for k, v in small.extra_headers.items()} == {"X-Gateway": "gateway-header-value"}
    assert (large.api, large.base_url, large.model, large.timeout_seconds) == (
        "chat",
        "http://127.0.0.1:9/v1",
        "gpt-4.1",
        60.0,
    )
    assert large.api_key.get_secret_value() == LARGE_KEY
    assert {k: v.get_secret_value() for k, v in large.extra_headers.items()} == {"X-Large": "large-header-value"}
    # No secret in what the settings show of themselves.
    shown = repr(settings) + repr(endpoints)
    assert LARGE_KEY not in shown and KEY not in shown and "header-value" not in shown


def test_an_entry_that_sets_nothing_is_the_openai_model_under_another_name() -> None:
    endpoint = _settings({"same": {}}, OPENAI_API_KEY=KEY, OPENAI_MODEL="m-default").model_endpoints()["same"]
    assert (endpoint.model, endpoint.api, endpoint.api_key.get_secret_value()) == ("m-default", "responses", KEY)


def test_unset_or_empty_there_are_no_named_models() -> None:
    assert WorkerSettings.model_validate({}).named_models == {}
    assert WorkerSettings.model_validate({"TOOLLOOP_MODELS": "  "}).named_models == {}


@pytest.mark.parametrize(
    ("table", "env", "expected"),
    [
        ("{not json", {}, "TOOLLOOP_MODELS: Value error, must be a JSON object"),
        ('["small"]', {}, "TOOLLOOP_MODELS: Value error, must be a JSON object"),
        ({"Small": {}}, {"OPENAI_API_KEY": KEY}, "TOOLLOOP_MODELS.Small.[key]: String should match pattern"),
        ({"a b": {}}, {"OPENAI_API_KEY": KEY}, "TOOLLOOP_MODELS.a b.[key]: String should match pattern"),
        ({"openai": {}}, {"OPENAI_API_KEY": KEY}, "TOOLLOOP_MODELS: Value error, 'openai' is already a model's name"),
        ({"offline": {}}, {"OPENAI_API_KEY": KEY}, "'offline' is already a model's name"),
        ({"script": {}}, {"OPENAI_API_KEY": KEY}, "'script' is already a model's name"),
        ({"small": {}}, {}, "TOOLLOOP_MODELS: Value error, small: its key variable OPENAI_API_KEY is not set"),
        (
            {"large": {"api_key_env": "NO_SUCH_KEY_VARIABLE_X"}},
            {"OPENAI_API_KEY": KEY},
            "large: its key variable NO_SUCH_KEY_VARIABLE_X is not set",
        ),
        ({"small": {"api": "completions"}}, {"OPENAI_API_KEY": KEY}, "TOOLLOOP_MODELS.small.api: Input should be"),
        ({"small": {"base_url": "localhost:1/v1"}}, {"OPENAI_API_KEY": KEY}, "small.base_url: Value error, must start"),
        ({"small": {"timeout_seconds": 0}}, {"OPENAI_API_KEY": KEY}, "small.timeout_seconds: Input should be greater"),
        ({"small": {"api_key": KEY}}, {"OPENAI_API_KEY": KEY}, "TOOLLOOP_MODELS.small.api_key: Extra inputs"),
    ],
)
def test_a_bad_table_is_one_line_naming_the_variable_and_never_its_value(
    table: object, env: dict[str, str], expected: str
) -> None:
    line = _error(table, **env)
    assert expected in line and line.endswith("(value not shown)"), line
    assert "\n" not in line and KEY not in line


def test_a_headers_variable_that_is_not_a_json_object_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LARGE_HEADERS", "secret-not-json")
    line = _error({"large": {"extra_headers_env": "LARGE_HEADERS"}}, OPENAI_API_KEY=KEY)
    assert "large: LARGE_HEADERS must be a JSON object" in line and "secret-not-json" not in line


def test_a_named_model_may_not_take_the_name_of_a_model_the_tools_module_brings() -> None:
    settings = _settings({"mine": {}}, OPENAI_API_KEY=KEY)
    with pytest.raises(ValueError, match="^TOOLLOOP_MODELS: 'mine' is already a model's name"):
        check_model_names_free(settings, ["mine"])
    check_model_names_free(settings, ["other"])


def test_the_worker_refuses_to_start_with_a_bad_table_in_one_line() -> None:
    env = {
        **os.environ,
        "OPENAI_API_KEY": KEY,
        "TOOLLOOP_MODELS": json.dumps({"large": {"api_key_env": "NO_SUCH_KEY_VARIABLE_X"}}),
    }
    done = subprocess.run(
        [sys.executable, "worker.py", "--tools", "demo.agent:build"],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: TOOLLOOP_MODELS: ") and "NO_SUCH_KEY_VARIABLE_X is not set" in line, line
    assert KEY not in line


def test_a_named_model_takes_no_model_of_its_own() -> None:
    names = frozenset({"small", "large"})
    assert named_model_refusal(ModelSpec.named("large"), names) is None
    assert named_model_refusal(ModelSpec.named("openai:gpt-4.1"), names) is None
    assert named_model_refusal(ModelSpec.named("offline"), names) is None
    refusal = named_model_refusal(ModelSpec.named("large:other-model"), names)
    assert refusal is not None and "name it as 'large', without ':MODEL'" in refusal
    assert named_models('{"small": {"model": "m"}}')["small"].model == "m"


def _request(model_name: str | None = None) -> ModelRequest:
    return ModelRequest(
        turn=1,
        conversation=[user_message("hi")],
        instructions="",
        tools=[],
        actor=Actor(user_id="u1"),
        model_name=model_name,
    )


async def test_each_named_model_asks_its_own_endpoint_for_its_own_model(server: FakeOpenAIServer) -> None:
    settings = _settings(
        {"small": {"model": "small-model"}, "large": {"model": "large-model", "api": "chat"}},
        OPENAI_API_KEY=KEY,
        OPENAI_BASE_URL=server.url,
    )
    async with settings_models(settings) as models:
        small, large = models["small"], models["large"]
        assert isinstance(small, NamedModel) and isinstance(large, NamedModel)
        assert (small.label(None), large.label(None)) == ("small (small-model)", "large (large-model)")
        server.reply(responses_response(output_message("from small")))
        [answer] = await small.respond(_request())
        assert isinstance(answer, MessageItem) and answer.text() == "from small"
        server.reply(chat_completion("from large"))
        [answer] = await large.respond(_request("large-model"))  # its own model, named: the same
        assert isinstance(answer, MessageItem) and answer.text() == "from large"
        with pytest.raises(ModelCallError) as refused:
            await large.respond(_request("other-model"))
    assert refused.value.kind == "rejected" and "'large' serves 'large-model' only" in str(refused.value)
    sent = [(r.path, r.body["model"]) for r in server.requests]
    assert sent == [("/v1/responses", "small-model"), ("/v1/chat/completions", "large-model")]


def test_the_local_stack_gives_its_worker_and_api_the_named_models_and_the_worker_their_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = StackSecrets(admin_token="t", approval_key=generate_signing_key())
    plain = Settings.model_validate({"TOOLLOOP_DATA_DIR": str(tmp_path)})
    assert "TOOLLOOP_MODELS" not in LocalStack(plain, REPO_ROOT)._worker_env(secrets)
    monkeypatch.setenv("LARGE_API_KEY", LARGE_KEY)
    table = {"small": {"model": "m-small"}, "large": {"api_key_env": "LARGE_API_KEY"}}
    named = Settings.model_validate(
        {"TOOLLOOP_DATA_DIR": str(tmp_path), "OPENAI_API_KEY": KEY, "TOOLLOOP_MODELS": json.dumps(table)}
    )
    stack = LocalStack(named, REPO_ROOT)
    worker, api = stack._worker_env(secrets), stack._api_env(secrets)
    assert json.loads(worker["TOOLLOOP_MODELS"]) == table == json.loads(api["TOOLLOOP_MODELS"])
    assert (worker["LARGE_API_KEY"], worker["OPENAI_API_KEY"]) == (LARGE_KEY, KEY)
    # The API gets the names and settings, never a key; it knows the named models among the worker's.
    assert "LARGE_API_KEY" not in api and "OPENAI_API_KEY" not in api
    assert api["TOOLLOOP_API_MODELS"] == "large,offline,openai,script,small"
    assert demo_model_names(False, ["small"]) == ["offline", "script", "small"]


def test_streaming_is_the_workers_unless_a_named_model_says_otherwise() -> None:
    settings = _settings(
        {"small": {"model": "gpt-4.1-mini"}, "plain": {"model": "local", "stream": False}},
        OPENAI_API_KEY=KEY,
    )
    assert {name: e.stream for name, e in settings.model_endpoints().items()} == {
        "openai": True,
        "small": True,
        "plain": False,
    }
    off = _settings({"small": {}, "on": {"stream": True}}, OPENAI_API_KEY=KEY, OPENAI_STREAM="false")
    assert {name: e.stream for name, e in off.model_endpoints().items()} == {
        "openai": False,
        "small": False,
        "on": True,
    }
