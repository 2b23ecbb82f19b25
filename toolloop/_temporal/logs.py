"""Wiring (entry points): structured JSON logs, one object per line on stderr, for the worker, the API and the
business service. A record's `extra` fields become keys (request_id, round, call_id, tool, duration_ms, code,
side_effect, ...); Temporal's own context (workflow and activity ids) rides along as nested objects."""

from __future__ import annotations

import logging
import sys

import temporalio.activity
import temporalio.workflow
from pythonjsonlogger.json import JsonFormatter


def configure_logging(component: str, level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            static_fields={"component": component},
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # The ids go into fields of their own, not into the message text.
    temporalio.activity.logger.activity_info_on_message = False
    temporalio.workflow.logger.workflow_info_on_message = False
