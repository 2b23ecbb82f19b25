"""Pure: the HTTP API's limits per caller (toolloop._api.limits) - stream slots, the creation rate, the caps on a
request's own limits, the tool names, the models each caller may use, and reading them from the environment -
its OpenAPI error table, and the tokens file's model lists. No server; the same limits over real HTTP are in
tests/test_api_limits_e2e.py and tests/test_api_models_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.api_helpers import demo_tool_names
from tests.conftest import REPO_ROOT
from toolloop import Actor
from toolloop._api.limits import ApiLimits, CreationRate, StreamSlots, limits_from_environment
from toolloop._api.openapi import PROBLEM_STATUS, problems
from toolloop._api.tokens import Grant, TokenMap, TokensFileError
from toolloop._core.contracts import Limits, ModelSpec

U1 = Actor(user_id="u1", tenant_id="acme")
U2 = Actor(user_id="u2", tenant_id="acme")
U1_GLOBEX = Actor(user_id="u1", tenant_id="globex")


def test_stream_slots_cap_each_caller_and_the_total_and_come_back() -> None:
    slots = StreamSlots(per_caller=2, total=3)
    assert slots.take(U1) is None and slots.take(U1) is None
    refused = slots.take(U1)
    assert refused is not None and "close one first" in refused
    assert slots.held(U1) == 2
    # Another caller is not held back by u1's streams, nor is the same user id in another tenant...
    assert slots.take(U1_GLOBEX) is None
    # ...until all of them together hold the API's most.
    refused = slots.take(U2)
    assert refused is not None and "the API holds its most" in refused
    assert (slots.held(U2), slots.held()) == (0, 3)
    slots.give_back(U1)
    assert slots.take(U2) is None
    for actor in (U1, U1_GLOBEX, U2):
        slots.give_back(actor)
    assert slots.held() == 0 and slots.take(U1) is None


def test_the_creation_rate_is_per_caller_and_says_how_long_to_wait() -> None:
    rate = CreationRate("2/hour")
    assert rate.take(U1) is None and rate.take(U1) is None
    wait = rate.take(U1)
    assert wait is not None and 1 <= wait <= 3600
    # Keyed by tenant and user: the same user id in another tenant has a window of its own.
    assert rate.take(U1_GLOBEX) is None and rate.take(U2) is None


def test_a_requests_own_limits_over_the_caps_are_refused_and_defaults_are_lowered_to_them() -> None:
    limits = ApiLimits(max_deadline_seconds=120, max_approval_ttl_seconds=60)
    assert limits.limits_problem(121, None) == "limits.deadline_seconds: at most 120"
    assert limits.limits_problem(None, 60.5) == "limits.approval_ttl_seconds: at most 60"
    assert limits.limits_problem(120, 60) is None and limits.limits_problem(None, None) is None
    # What a request leaves out is toolloop's default, lowered to the cap where the default is above it.
    capped = limits.request_limits({})
    assert (capped.deadline_seconds, capped.approval_ttl_seconds) == (120, 60)
    assert limits.request_limits({"deadline_seconds": 30}).deadline_seconds == 30
    # With caps above the defaults, a request's limits are exactly toolloop's (its digest does not change).
    assert ApiLimits().request_limits({}) == Limits()


def test_unknown_tools_are_named_only_when_the_api_is_told_the_workers_tools() -> None:
    told = ApiLimits(tools="get_order_status, refund_order")
    assert told.tools == frozenset({"get_order_status", "refund_order"})
    assert told.unknown_tools(["refund_order", "nosuch", "other", "nosuch"]) == ["nosuch", "other"]
    assert told.unknown_tools(None) == [] and told.unknown_tools(["get_order_status"]) == []
    assert ApiLimits().unknown_tools(["nosuch"]) == []
    assert ApiLimits(tools=" , ").tools is None
    with pytest.raises(ValidationError, match="tool names must match"):
        ApiLimits(tools="ok, not a name")


def test_the_limits_are_read_from_the_environment_and_a_bad_one_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TOOLLOOP_API_MAX_STREAMS_PER_CALLER", "3")
    monkeypatch.setenv("TOOLLOOP_API_MAX_STREAMS", "7")
    monkeypatch.setenv("TOOLLOOP_API_CREATE_RATE", "5/second")
    monkeypatch.setenv("TOOLLOOP_API_MAX_ACTIVE_REQUESTS", "4")
    monkeypatch.setenv("TOOLLOOP_API_MAX_DEADLINE_SECONDS", "900")
    monkeypatch.setenv("TOOLLOOP_API_MAX_APPROVAL_TTL_SECONDS", "")  # empty: unset, the default
    monkeypatch.setenv("TOOLLOOP_API_TOOLS", "a,b")
    monkeypatch.setenv("TOOLLOOP_API_MODELS", "offline, openai")
    read = limits_from_environment()
    assert read.models == frozenset({"offline", "openai"}) and read.unknown_model("script")
    assert not read.unknown_model("openai")
    assert (read.max_streams_per_caller, read.max_streams, read.create_rate) == (3, 7, "5/second")
    assert (read.max_active_requests, read.max_deadline_seconds, read.max_approval_ttl_seconds) == (4, 900, 3600)
    assert read.tools == frozenset({"a", "b"})
    for name, bad in (
        ("TOOLLOOP_API_CREATE_RATE", "lots"),
        ("TOOLLOOP_API_MAX_STREAMS", "0"),
        ("TOOLLOOP_API_MODELS", "offline,Not A Model"),
    ):
        with monkeypatch.context() as env:
            env.setenv(name, bad)
            with pytest.raises(SystemExit) as exited:
                limits_from_environment()
        assert exited.value.code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {name}: "), lines


def test_every_problem_code_is_documented_as_problem_json_with_its_status() -> None:
    responses = problems(*PROBLEM_STATUS)
    assert set(responses) == set(PROBLEM_STATUS.values())
    for status, response in responses.items():
        assert list(response["content"]) == ["application/problem+json"]
        named = response["description"].removeprefix("code ").split(" | ")
        assert all(PROBLEM_STATUS[code] == status for code in named)
    assert "Retry-After" in responses[429]["headers"]


def test_the_deployment_example_names_the_tools_its_worker_serves() -> None:
    # docker-compose runs the demo's worker; its API must know exactly those tools.
    compose = (REPO_ROOT / "docker-compose.yml").read_text()
    assert f"TOOLLOOP_API_TOOLS: ${{TOOLLOOP_API_TOOLS:-{demo_tool_names()}}}" in compose


def _refusal(limits: ApiLimits, model: str, granted: frozenset[str] | None, defaulted: bool = False) -> object:
    return limits.model_refusal(ModelSpec.named(model), granted, defaulted=defaulted)


def test_named_models_are_known_to_the_api_and_take_no_model_of_their_own() -> None:
    limits = ApiLimits(models="offline", named_models='{"small": {"model": "m"}, "large": {}}')
    assert limits.known_models == frozenset({"offline", "small", "large"})
    assert _refusal(limits, "small", None) is None and _refusal(limits, "openai:x", None) is not None
    assert _refusal(limits, "large:other-model", None) == (
        "model: 'large' is a configured model that serves one provider model; name it as 'large', without ':MODEL'",
        ["large", "offline", "small"],
    )
    # Not told the workers' models: nothing is checked but a named model's ":MODEL".
    open_api = ApiLimits(named_models='{"large": {}}')
    assert open_api.known_models is None and _refusal(open_api, "anything:x", None) is None
    assert _refusal(open_api, "large:x", None) == (
        "model: 'large' is a configured model that serves one provider model; name it as 'large', without ':MODEL'",
        None,
    )
    with pytest.raises(ValidationError, match="'openai' is already a model's name"):
        ApiLimits(named_models='{"openai": {}}')


def test_a_model_the_caller_may_not_use_is_refused_with_the_same_words_as_one_that_does_not_exist() -> None:
    limits = ApiLimits(models="offline,script", named_models='{"small": {}, "large": {}}')
    small_only = frozenset({"small"})
    forbidden, unknown = _refusal(limits, "large", small_only), _refusal(limits, "nosuch", small_only)
    assert forbidden == ("model: the worker has no model 'large' you may use; you may use small", ["small"])
    assert unknown == ("model: the worker has no model 'nosuch' you may use; you may use small", ["small"])
    # Even with a ":MODEL": that a name is a named model is not the caller's to learn.
    assert _refusal(limits, "large:x", small_only) == (
        "model: the worker has no model 'large' you may use; you may use small",
        ["small"],
    )
    assert _refusal(limits, "small", small_only) is None
    # Without a list: every model the API knows, and only those.
    assert _refusal(limits, "large", None) is None
    assert _refusal(limits, "nosuch", None) == (
        "model: the worker has no model 'nosuch' you may use; you may use large, offline, script, small",
        ["large", "offline", "script", "small"],
    )
    # An empty list: no model at all (a caller that only reads and decides).
    assert _refusal(limits, "offline", frozenset()) == (
        "model: the worker has no model 'offline' you may use; you may use none",
        [],
    )
    # The API's default, when it is not the caller's: said so, without naming it.
    assert _refusal(limits, "offline", small_only, defaulted=True) == (
        "model: this API's default model is not one you may use; name one: you may use small",
        ["small"],
    )
    # A list is the caller's even when the API is not told the workers' models.
    assert _refusal(ApiLimits(), "offline", small_only) is not None
    assert ApiLimits().usable_models(None) is None and ApiLimits().usable_models(small_only) == small_only


def _tokens(tmp_path: Path, *entries: dict[str, object]) -> TokenMap:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": list(entries)}))
    return TokenMap.load(path)


def test_a_tokens_file_entry_may_list_the_models_its_caller_may_use(tmp_path: Path) -> None:
    tokens = _tokens(
        tmp_path,
        {"token": "a-token-limited-to-small-0001", "tenant_id": "acme", "user_id": "u1", "models": ["small"]},
        {"token": "a-token-with-every-model-0002", "tenant_id": "acme", "user_id": "u2"},
        {"token": "a-token-for-no-model-at-all-03", "tenant_id": "acme", "user_id": "u3", "models": []},
    )
    assert tokens.grant_for("a-token-limited-to-small-0001") == Grant(U1, frozenset({"small"}))
    assert tokens.grant_for("a-token-with-every-model-0002") == Grant(U2, None)
    found = tokens.grant_for("a-token-for-no-model-at-all-03")
    assert found is not None and found.models == frozenset()
    assert tokens.actor_for("a-token-limited-to-small-0001") == U1 and tokens.grant_for("nope") is None
    assert [g.actor.user_id for g in tokens.grants()] == ["u1", "u2", "u3"]
    with pytest.raises(TokensFileError, match=r"tokens\.0\.models\.0: String should match pattern"):
        _tokens(tmp_path, {"token": "a-token-limited-to-small-0001", "tenant_id": "a", "user_id": "u", "models": ["A"]})
