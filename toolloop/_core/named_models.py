"""Pure: a worker's named model configurations (TOOLLOOP_MODELS) - several OpenAI-compatible models under names
of their own ("small", "large"), each what differs from the OPENAI_* settings - and the rule that a named model
serves its configured provider model only.

No secret is ever in the table: an entry names the environment variable that holds its key
(`api_key_env`) and its extra headers (`extra_headers_env`); the worker's settings read them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

from toolloop._core.contracts import MODEL_NAME, ModelSpec

# Names a worker gives models whatever its configuration (the script model, the `openai` model of the OPENAI_*
# settings, the demo's offline model): a named model may not take one, so a request's name means one model.
RESERVED_MODEL_NAMES = frozenset({"offline", "openai", "script"})
ENV_VARIABLE = r"^[A-Za-z_][A-Za-z0-9_]*$"
DEFAULT_KEY_VARIABLE = "OPENAI_API_KEY"
DEFAULT_HEADERS_VARIABLE = "OPENAI_EXTRA_HEADERS"
NAMED_MODELS_SHAPE = (
    '{"NAME": {"model": "...", "api": "responses|chat", "base_url": "https://...", "api_key_env": "VARIABLE", '
    '"extra_headers_env": "VARIABLE", "timeout_seconds": N}} (every field optional)'
)


class NamedModelConfig(BaseModel):
    """One entry of TOOLLOOP_MODELS: what this model sets differently from the OPENAI_* settings (None and the
    defaults: the same as they)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # The provider's model name (default: OPENAI_MODEL).
    model: str | None = Field(default=None, min_length=1, max_length=200)
    # Which API the endpoint speaks (default: OPENAI_API).
    api: Literal["responses", "chat"] | None = None
    # The endpoint (default: OPENAI_BASE_URL).
    base_url: str | None = None
    # The variable holding the key, and the one holding a JSON object of extra headers.
    api_key_env: str = Field(default=DEFAULT_KEY_VARIABLE, pattern=ENV_VARIABLE)
    extra_headers_env: str = Field(default=DEFAULT_HEADERS_VARIABLE, pattern=ENV_VARIABLE)
    # How long one call may take (default: OPENAI_TIMEOUT_SECONDS).
    timeout_seconds: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    # Whether calls ask for a streamed answer (default: OPENAI_STREAM); false for an endpoint that cannot.
    stream: bool | None = None

    @field_validator("base_url")
    @classmethod
    def _an_http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value


ModelName = Annotated[str, Field(pattern=MODEL_NAME)]
NamedModels = dict[ModelName, NamedModelConfig]
_TABLE: TypeAdapter[NamedModels] = TypeAdapter(NamedModels)


def read_named_models(value: object) -> object:
    """TOOLLOOP_MODELS's text as a JSON object (empty: none), for a settings field whose type checks the rest;
    a mapping is passed on as it is."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            raise ValueError(f"must be a JSON object: {NAMED_MODELS_SHAPE}") from None
        if not isinstance(value, dict):
            raise ValueError(f"must be a JSON object: {NAMED_MODELS_SHAPE}")
    return value


def check_model_names(table: Mapping[str, NamedModelConfig], taken: frozenset[str] = RESERVED_MODEL_NAMES) -> None:
    """A ValueError naming the first configured name that another model already has."""
    clash = sorted(set(table) & taken)
    if clash:
        raise ValueError(
            f"{clash[0]!r} is already a model's name ({', '.join(sorted(taken))} are taken); choose another"
        )


def named_models(value: str | Mapping[str, object]) -> NamedModels:
    """A table from JSON text or a mapping, its names checked (a ValueError says what is wrong)."""
    table = _TABLE.validate_python(read_named_models(value))
    check_model_names(table)
    return table


def named_model_refusal(spec: ModelSpec, names: Mapping[str, object] | frozenset[str]) -> str | None:
    """Why a request may not ask for `spec` when `names` are named models, or None: a named model is its one
    configured provider model, so it takes no `:MODEL` (another model is another name)."""
    if spec.provider in names and spec.name is not None:
        return (
            f"{spec.provider!r} is a configured model that serves one provider model; "
            f"name it as {spec.provider!r}, without ':MODEL'"
        )
    return None
