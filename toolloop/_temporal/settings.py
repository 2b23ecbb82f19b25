"""Configuration, by process: what a worker, the HTTP API and the CLI each read from the environment (frozen
models, read by the entry points only and passed into constructors). A worker's settings hold no signing key
and the API's no verify key: what decides trust is the configuration of the process that holds it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, PrivateAttr, SecretStr, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from toolloop._core.named_models import (
    DEFAULT_HEADERS_VARIABLE,
    DEFAULT_KEY_VARIABLE,
    NamedModels,
    check_model_names,
    read_named_models,
)
from toolloop._core.usage import PRICE_TABLE_SHAPE, ModelPrice


class TemporalSettings(BaseSettings):
    """Where Temporal is, for every process."""

    # An empty variable (e.g. OPENAI_MODEL= passed through by compose) means "not set".
    model_config = SettingsConfigDict(frozen=True, extra="ignore", populate_by_name=True, env_ignore_empty=True)

    temporal_address: str = Field(default="127.0.0.1:7233", validation_alias="TEMPORAL_ADDRESS")
    temporal_namespace: str = Field(default="default", validation_alias="TEMPORAL_NAMESPACE")
    task_queue: str = Field(default="toolloop", validation_alias="TOOLLOOP_TASK_QUEUE")
    # OpenTelemetry tracing exported over OTLP/HTTP (off).
    otel: bool = Field(default=False, validation_alias="TOOLLOOP_OTEL")
    # The live text store, a Redis URL (redis://host:6379/0): workers write each model turn's text there as it
    # streams, the CLI and the API read it (docs/DESIGN.md, "Live text"). Unset: answers appear per request.
    live_text_url: str | None = Field(default=None, validation_alias="TOOLLOOP_LIVE_TEXT_URL")

    @field_validator("live_text_url")
    @classmethod
    def _a_redis_url(cls, value: str | None) -> str | None:
        # Refused at start: a store no write can reach would only log a warning per turn.
        if value is not None and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be a Redis URL (redis://host:6379/0, rediss:// for TLS)")
        return value


def _header_table(value: object) -> dict[str, str]:
    """A JSON object of header names and values (strings), from a variable's text; a ValueError says not."""
    if not isinstance(value, str):
        raise ValueError("must be a JSON object of header names and values")
    try:
        headers = json.loads(value) if value.strip() else {}
    except ValueError:
        raise ValueError("must be a JSON object of header names and values") from None
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise ValueError("must be a JSON object of header names and values (strings)")
    return headers


@dataclass(frozen=True)
class ModelEndpoint:
    """One OpenAI-compatible model a worker serves, every setting resolved: the `openai` model of the OPENAI_*
    settings, or a named one of TOOLLOOP_MODELS (its settings over those)."""

    api: Literal["responses", "chat"]
    base_url: str
    model: str
    api_key: SecretStr = field(repr=False)
    timeout_seconds: float
    extra_headers: dict[str, SecretStr] = field(default_factory=dict, repr=False)
    stream: bool = True


class WorkerSettings(TemporalSettings):
    """A worker's (`worker.py`): its trust anchor and its models. No approval signing key: a worker verifies
    decisions, it never makes them."""

    # The demo's tools call the business service here.
    service_url: str = Field(default="http://127.0.0.1:8701", validation_alias="TOOLLOOP_SERVICE_URL")
    # The trust anchor: the public key(s) that verify decisions (several, separated by commas, during a
    # rotation). Worker configuration only: never sent with a request.
    approval_verify_key: str | None = Field(default=None, validation_alias="TOOLLOOP_APPROVAL_VERIFY_KEY")
    # A worker serves the scripted models (the script model, the demo's offline model) only when this says so:
    # tests, the local demo stack, the chaos runner and the benchmark do; a deployment's worker does not.
    allow_scripted_models: bool = Field(default=False, validation_alias="TOOLLOOP_ALLOW_SCRIPTED_MODELS")
    # Where the policy evaluator runs (python worker.py --policy); unset: every write asks its requester.
    policy_task_queue: str | None = Field(default=None, validation_alias="TOOLLOOP_POLICY_TASK_QUEUE")
    # The policy evaluator's public key(s): the workflow takes a decision only when it verifies with one.
    policy_verify_key: str | None = Field(default=None, validation_alias="TOOLLOOP_POLICY_VERIFY_KEY")
    # How long the business service keeps operation ids, for a service that does not declare it on its
    # status answers. Unknown (unset and undeclared) means a resend after a doubtful attempt fails closed.
    idempotency_retention_seconds: float | None = Field(
        default=None, gt=0, validation_alias="TOOLLOOP_IDEMPOTENCY_RETENTION_SECONDS"
    )
    # The `openai` model (docs/MODELS.md): served when the key is set, through the official SDK.
    openai_api_key: SecretStr | None = Field(default=None, validation_alias="OPENAI_API_KEY")
    openai_base_url: str = Field(default="https://api.openai.com/v1", validation_alias="OPENAI_BASE_URL")
    openai_model: str = Field(default="gpt-4.1-mini", validation_alias="OPENAI_MODEL")
    # Which API the endpoint speaks: the Responses API, or Chat Completions (vLLM, llama.cpp, Ollama, ...).
    openai_api: Literal["responses", "chat"] = Field(default="responses", validation_alias="OPENAI_API")
    # Headers sent with every model call, a JSON object ({"api-key": "...", "X-Title": "toolloop"}); the
    # values are kept secret, as a gateway's key may be one of them.
    openai_extra_headers: Annotated[dict[str, SecretStr], NoDecode] = Field(
        default_factory=dict, validation_alias="OPENAI_EXTRA_HEADERS"
    )
    # Whether model calls ask for a streamed answer (its text shown as it is written: TOOLLOOP_LIVE_TEXT_URL).
    # Off for an endpoint that cannot stream; the answer is the same either way.
    openai_stream: bool = Field(default=True, validation_alias="OPENAI_STREAM")
    # How long one model call may take before it counts as a temporary failure (retried by the activity).
    openai_timeout_seconds: float = Field(default=120.0, gt=0, validation_alias="OPENAI_TIMEOUT_SECONDS")
    # A Prometheus endpoint ("127.0.0.1:9464"; unset: none).
    metrics_address: str | None = Field(default=None, validation_alias="TOOLLOOP_METRICS_ADDRESS")
    # Runs a worker keeps in memory between their tasks (Temporal's default is 1,000). Above it, a task of
    # an evicted run replays its whole history first: at thousands of open requests (each waiting on a
    # model, a tool or an approval) that replay is most of the worker's CPU. A cached run holds well under
    # 0.1 MiB (measured by `python -m bench`).
    max_cached_workflows: int = Field(default=10_000, ge=0, validation_alias="TOOLLOOP_MAX_CACHED_WORKFLOWS")
    # The price per million tokens of each model by the name it is asked for, a JSON object
    # ({"gpt-4.1-mini": {"input": 0.40, "cached_input": 0.10, "output": 1.60}}; docs/MODELS.md): a turn of a
    # model in it is recorded with its cost, which a request's max_cost counts. Unset: costs are unknown.
    model_prices: Annotated[dict[str, ModelPrice], NoDecode] = Field(
        default_factory=dict, validation_alias="TOOLLOOP_MODEL_PRICES"
    )
    # Named models (docs/MODELS.md), a JSON object: {"small": {"model": "gpt-4.1-mini"}, "large": {"model":
    # "gpt-4.1", "api": "chat", "base_url": "...", "api_key_env": "LARGE_API_KEY"}}. Each is served under its
    # name, with the OPENAI_* settings it does not set; a key or header is never in it, only the name of the
    # variable that holds it. After the OPENAI_* fields: its check reads them.
    named_models: Annotated[NamedModels, NoDecode] = Field(default_factory=dict, validation_alias="TOOLLOOP_MODELS")
    # The values of the variables the named models name other than OPENAI_API_KEY and OPENAI_EXTRA_HEADERS, read
    # once with the rest of the settings (the worker's entry point), by variable name.
    _model_secrets: dict[str, SecretStr] = PrivateAttr(default_factory=dict)
    _model_headers: dict[str, dict[str, SecretStr]] = PrivateAttr(default_factory=dict)

    @field_validator("openai_extra_headers", mode="before")
    @classmethod
    def _a_json_object(cls, value: object) -> object:
        # Read here, not by pydantic-settings, so a bad value is one line naming the variable (settings_error).
        if not isinstance(value, str):
            return value
        return _header_table(value)

    @field_validator("named_models", mode="before")
    @classmethod
    def _a_model_table(cls, value: object) -> object:
        # Parsed here so a bad value is one line naming the variable; the entries are checked as the type.
        return read_named_models(value)

    @field_validator("named_models")
    @classmethod
    def _usable_models(cls, value: NamedModels, info: ValidationInfo) -> NamedModels:
        # Refused at start, not at a request's first turn: a name another model has, or a key that is not there.
        check_model_names(value)
        for name, config in sorted(value.items()):
            if config.api_key_env == DEFAULT_KEY_VARIABLE:
                if info.data.get("openai_api_key") is None:
                    raise ValueError(f"{name}: its key variable {DEFAULT_KEY_VARIABLE} is not set")
            elif not os.environ.get(config.api_key_env, "").strip():
                raise ValueError(f"{name}: its key variable {config.api_key_env} is not set")
            if config.extra_headers_env != DEFAULT_HEADERS_VARIABLE:
                try:
                    _header_table(os.environ.get(config.extra_headers_env, ""))
                except ValueError as exc:
                    raise ValueError(f"{name}: {config.extra_headers_env} {exc}") from None
        return value

    @model_validator(mode="after")
    def _read_model_secrets(self) -> WorkerSettings:
        # Kept beside the table, never in it: a named model's key and headers by the variable that holds them.
        for config in self.named_models.values():
            if config.api_key_env != DEFAULT_KEY_VARIABLE:
                self._model_secrets[config.api_key_env] = SecretStr(os.environ[config.api_key_env].strip())
            if config.extra_headers_env != DEFAULT_HEADERS_VARIABLE:
                headers = _header_table(os.environ.get(config.extra_headers_env, ""))
                self._model_headers[config.extra_headers_env] = {k: SecretStr(v) for k, v in headers.items()}
        return self

    def model_endpoints(self) -> dict[str, ModelEndpoint]:
        """The OpenAI-compatible models this worker serves by name: `openai` when OPENAI_API_KEY is set, and
        every named model, each with the OPENAI_* settings it does not set itself."""
        endpoints: dict[str, ModelEndpoint] = {}
        default_headers = dict(self.openai_extra_headers)
        if self.openai_api_key is not None:
            endpoints["openai"] = ModelEndpoint(
                api=self.openai_api,
                base_url=self.openai_base_url,
                model=self.openai_model,
                api_key=self.openai_api_key,
                timeout_seconds=self.openai_timeout_seconds,
                extra_headers=default_headers,
                stream=self.openai_stream,
            )
        for name, config in self.named_models.items():
            if config.api_key_env == DEFAULT_KEY_VARIABLE:
                key = self.openai_api_key
            else:
                key = self._model_secrets.get(config.api_key_env)
            if key is None:  # a copy of the settings without the key its check saw
                raise ValueError(f"TOOLLOOP_MODELS: {name}: its key variable {config.api_key_env} is not set")
            if config.extra_headers_env == DEFAULT_HEADERS_VARIABLE:
                headers = default_headers
            else:
                headers = self._model_headers.get(config.extra_headers_env, {})
            endpoints[name] = ModelEndpoint(
                api=config.api or self.openai_api,
                base_url=config.base_url or self.openai_base_url,
                model=config.model or self.openai_model,
                api_key=key,
                timeout_seconds=config.timeout_seconds or self.openai_timeout_seconds,
                extra_headers=headers,
                stream=self.openai_stream if config.stream is None else config.stream,
            )
        return endpoints

    @field_validator("model_prices", mode="before")
    @classmethod
    def _a_price_table(cls, value: object) -> object:
        # Parsed here (not by pydantic-settings) so a bad value is one line naming the variable; the prices
        # themselves are checked as the field's type (ModelPrice).
        if isinstance(value, str):
            try:
                return json.loads(value) if value.strip() else {}
            except ValueError:
                raise ValueError(f"must be a JSON object: {PRICE_TABLE_SHAPE}") from None
        return value

    @field_validator("openai_base_url")
    @classmethod
    def _an_http_url(cls, value: str) -> str:
        # Refused at start: a base URL the SDK cannot use would fail every model call instead.
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value


class PolicySettings(TemporalSettings):
    """The policy evaluator's settings (python worker.py --policy): the only process that holds the policy's
    signing key."""

    policy_file: Path = Field(validation_alias="TOOLLOOP_POLICY_FILE")
    policy_schema: Path = Field(validation_alias="TOOLLOOP_POLICY_SCHEMA")
    policy_signing_key: SecretStr = Field(validation_alias="TOOLLOOP_POLICY_SIGNING_KEY")
    policy_task_queue: str = Field(default="toolloop-policy", validation_alias="TOOLLOOP_POLICY_TASK_QUEUE")
    # The approval channel's public key(s): the grants people give with their approvals are honoured only then.
    approval_verify_key: str | None = Field(default=None, validation_alias="TOOLLOOP_APPROVAL_VERIFY_KEY")


class ApiSettings(TemporalSettings):
    """The HTTP API's (`starter.py serve`): its callers' tokens and the approval channel's signing key. No
    verify key and no scripted models: those are a worker's."""

    # The approval channel's private key (toolloop._core.approvals): held by the API and the CLI only, never
    # by workers or the service.
    approval_key: SecretStr | None = Field(default=None, validation_alias="TOOLLOOP_APPROVAL_KEY")
    api_port: int = Field(default=8702, ge=1, le=65535, validation_alias="TOOLLOOP_API_PORT")
    # The bearer tokens file, and the model a request gets by default.
    api_tokens: Path = Field(default=Path("config/api_tokens.json"), validation_alias="TOOLLOOP_API_TOKENS")
    api_default_model: str = Field(default="offline", validation_alias="TOOLLOOP_API_MODEL")
    # The published demo tokens are refused unless this says the API runs a local demo (the local stack does).
    api_allow_demo_tokens: bool = Field(default=False, validation_alias="TOOLLOOP_API_ALLOW_DEMO_TOKENS")
    api_metrics_address: str | None = Field(default=None, validation_alias="TOOLLOOP_API_METRICS_ADDRESS")


class Settings(WorkerSettings, ApiSettings):
    """The CLI's (`starter.py`): it runs the local stack, so it configures a worker, the API and the demo
    service, and it is itself an approval channel (the signing key)."""

    service_admin_token: SecretStr | None = Field(default=None, validation_alias="TOOLLOOP_SERVICE_ADMIN_TOKEN")
    # The local stack that `starter.py up` / `ask` run.
    data_dir: Path = Field(default=Path(".toolloop"), validation_alias="TOOLLOOP_DATA_DIR")
    temporal_port: int = Field(default=7233, validation_alias="TOOLLOOP_TEMPORAL_PORT")
    ui_port: int = Field(default=8233, validation_alias="TOOLLOOP_UI_PORT")
    service_port: int = Field(default=8701, validation_alias="TOOLLOOP_SERVICE_PORT")

    def ui_url(self, workflow_id: str | None = None) -> str:
        host = self.temporal_address.rsplit(":", 1)[0]
        base = f"http://{host}:{self.ui_port}"
        if workflow_id is None:
            return base
        return f"{base}/namespaces/{self.temporal_namespace}/workflows/{workflow_id}"


# Variables whose values are never repeated in a message, even a wrong one.
# TOOLLOOP_MODELS holds no secret by design, but a key pasted into it by mistake must not be echoed either; a
# Redis URL may hold a password.
_SECRET_VARIABLES = frozenset(
    {
        "OPENAI_API_KEY",
        "OPENAI_EXTRA_HEADERS",
        "TOOLLOOP_APPROVAL_KEY",
        "TOOLLOOP_POLICY_SIGNING_KEY",
        "TOOLLOOP_MODELS",
        "TOOLLOOP_LIVE_TEXT_URL",
    }
)


def settings_error(exc: ValidationError) -> str:
    """A bad value in the environment, in one line that names the variable."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "settings"
    if first["loc"] and first["loc"][0] in _SECRET_VARIABLES:
        return f"{where}: {first['msg']} (value not shown)"
    return f"{where}: {first['msg']} (got {first.get('input')!r})"
