"""Wiring (entry points): metrics and tracing. A Prometheus endpoint serves Temporal's runtime metrics (the
SDK's own: workflow and activity tasks, RPCs, latencies) together with toolloop's counts - tool results by
tool and code, write attempts by outcome, operations by final state, model tokens by kind, API responses -
all recorded through Temporal's metric meter, so one endpoint per process has everything. Tracing is
OpenTelemetry through Temporal's interceptor, off unless asked for."""

from __future__ import annotations

from typing import Any

from temporalio.common import MetricMeter
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from toolloop._core.names import API_DECISIONS_METRIC as API_DECISIONS
from toolloop._core.names import API_RESPONSES_METRIC as API_RESPONSES
from toolloop._core.names import MODEL_TOKENS_METRIC as MODEL_TOKENS
from toolloop._core.names import TOOL_RESULTS_METRIC as TOOL_RESULTS
from toolloop._core.names import WRITE_ATTEMPTS_METRIC as WRITE_ATTEMPTS

__all__ = [
    "API_DECISIONS",
    "API_RESPONSES",
    "MODEL_TOKENS",
    "TOOL_RESULTS",
    "WRITE_ATTEMPTS",
    "count",
    "metrics_runtime",
]


def metrics_runtime(address: str | None) -> Runtime | None:
    """A Temporal runtime that serves Prometheus metrics at `address` ("127.0.0.1:9464"); None: no endpoint."""
    if not address:
        return None
    return Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=address)))


def count(meter: MetricMeter, name: str, description: str, amount: int = 1, **attributes: str) -> None:
    meter.create_counter(name, description).add(amount, attributes)


def tracing_interceptor() -> Any:
    """Temporal's OpenTelemetry interceptor (spans for starting and running workflows and activities), with
    the globally configured tracer provider. Needs the `otel` extra."""
    try:
        from temporalio.contrib.opentelemetry import TracingInterceptor
    except ImportError as exc:  # pragma: no cover - opentelemetry-api comes with the dependencies
        raise RuntimeError("tracing needs opentelemetry: pip install 'toolloop[otel]'") from exc
    return TracingInterceptor()


def configure_otlp_tracing(service_name: str) -> None:
    """An OTLP/HTTP exporter for the spans (endpoint from OTEL_EXPORTER_OTLP_ENDPOINT, as OpenTelemetry does)."""
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise RuntimeError("TOOLLOOP_OTEL=1 needs the otel extra: pip install 'toolloop[otel]'") from None
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
