"""Wiring: the one data converter shared by worker, starter and tests: Temporal's pydantic data converter
(pydantic models as JSON payloads, every field written), with a failure converter that keeps a failed
request's report and drops the workflow code's stack trace."""

import dataclasses

import temporalio.api.failure.v1
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter, DefaultFailureConverter, PayloadConverter
from temporalio.exceptions import ApplicationError

from toolloop._core.codes import ErrorType


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


_DATA_CONVERTER = dataclasses.replace(pydantic_data_converter, failure_converter_class=ToolloopFailureConverter)


def data_converter() -> DataConverter:
    return _DATA_CONVERTER
