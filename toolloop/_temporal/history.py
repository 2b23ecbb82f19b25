"""Pure (over Temporal's protobufs): what a run's history says about a local activity. A regular activity's
result is in its ActivityTaskCompleted event; a local activity's is in the marker the SDK's core records when
the workflow task that ran it completes (its input is not stored at all)."""

from __future__ import annotations

import json
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

LOCAL_ACTIVITY_MARKER = "core_local_activity"


def local_activity_data(event: HistoryEvent) -> dict[str, Any] | None:
    """Core's record of a local activity (its type, id, attempt, schedule and completion times) from its
    marker; None for any other event."""
    if event.event_type != EventType.EVENT_TYPE_MARKER_RECORDED:
        return None
    marker = event.marker_recorded_event_attributes
    data = marker.details["data"].payloads if "data" in marker.details else []
    if marker.marker_name != LOCAL_ACTIVITY_MARKER or not data:
        return None
    try:
        # Core's own JSON (never through the client's codec).
        record = json.loads(data[0].data)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def local_activity_type(event: HistoryEvent) -> str | None:
    """The activity type of a local activity's marker (completed or failed); None for any other event."""
    record = local_activity_data(event)
    activity_type = None if record is None else record.get("activity_type")
    return activity_type if isinstance(activity_type, str) else None


def local_activity_payload(event: HistoryEvent) -> Payload | None:
    """The result payload a local activity's marker holds; None if it holds none (a failure)."""
    details = event.marker_recorded_event_attributes.details
    result = details["result"].payloads if "result" in details else []
    return result[0] if result else None


def local_activity_result(event: HistoryEvent) -> tuple[str, Payload] | None:
    """The activity type and the result payload of a local activity that completed; None for any other
    event (a failed local activity's marker holds a failure, not a result)."""
    activity_type = local_activity_type(event)
    payload = None if activity_type is None else local_activity_payload(event)
    return None if activity_type is None or payload is None else (activity_type, payload)
