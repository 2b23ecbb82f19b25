"""I/O and pure: the model adapters - the OpenAI Responses client and the offline models (demo and scripted).

This package knows nothing of Temporal: activities wrap it and map ModelCallError.kind to error types.
"""

from modeladapters.errors import ModelCallError, ModelCallErrorKind, ScriptError
from modeladapters.offline import OFFLINE_LABEL, OfflineDemoModel
from modeladapters.responses_client import DEFAULT_BASE_URL, ResponsesClient
from modeladapters.script import load_script, parse_script

__all__ = [
    "DEFAULT_BASE_URL",
    "OFFLINE_LABEL",
    "ModelCallError",
    "ModelCallErrorKind",
    "OfflineDemoModel",
    "ResponsesClient",
    "ScriptError",
    "load_script",
    "parse_script",
]
