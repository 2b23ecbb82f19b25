"""Wiring: the one data converter shared by worker, starter and tests (pydantic models as payloads).

Payloads are written with toolloop's serialization context, so models leave out the fields that hold their
empty default (toolloop._core.contracts.Compact): a smaller history that decodes to the same values."""

from typing import Any

import temporalio.api.common.v1
import temporalio.api.failure.v1
from pydantic_core import to_json
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter, PydanticPayloadConverter
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultFailureConverter,
    DefaultPayloadConverter,
    JSONPlainPayloadConverter,
    PayloadConverter,
)
from temporalio.exceptions import ApplicationError

from toolloop._core.codes import ErrorType
from toolloop._core.contracts import PAYLOAD_CONTEXT


class _PayloadJSONConverter(PydanticJSONPlainPayloadConverter):
    def to_payload(self, value: Any) -> temporalio.api.common.v1.Payload | None:
        return temporalio.api.common.v1.Payload(
            metadata={"encoding": self.encoding.encode()}, data=to_json(value, context=PAYLOAD_CONTEXT)
        )


class ToolloopPayloadConverter(PydanticPayloadConverter):
    """Temporal's pydantic payload converter, writing with toolloop's payload context."""

    def __init__(self) -> None:
        json_converter = _PayloadJSONConverter()
        CompositePayloadConverter.__init__(
            self,
            *(
                json_converter if isinstance(c, JSONPlainPayloadConverter) else c
                for c in DefaultPayloadConverter.default_encoding_payload_converters
            ),
        )


class ToolloopFailureConverter(DefaultFailureConverter):
    """Temporal's failure converter, except that a failed request's failure carries its message and its
    report, not the workflow code's stack trace: whoever opens the request in the UI reads why it failed,
    not the worker's file paths."""

    def to_failure(
        self,
        exception: BaseException,
        payload_converter: PayloadConverter,
        failure: temporalio.api.failure.v1.Failure,
    ) -> None:
        super().to_failure(exception, payload_converter, failure)
        if isinstance(exception, ApplicationError) and exception.type == ErrorType.REQUEST_FAILED:
            failure.stack_trace = ""


_DATA_CONVERTER = DataConverter(
    payload_converter_class=ToolloopPayloadConverter, failure_converter_class=ToolloopFailureConverter
)


def data_converter() -> DataConverter:
    return _DATA_CONVERTER
