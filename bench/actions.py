"""Pure: Temporal Cloud's billable actions of one workflow run, counted from its history by the rules Temporal
documents (docs.temporal.io/cloud/actions): the workflow's start, each timer started, each search-attribute
upsert, each signal, each update the worker accepted, each activity attempt (the started event's attempt number
counts the retries before it), and each local activity's marker. Queries reach the worker without entering
history; neither stack's client asks one while a request runs. A child workflow's start is one action ("Workflow
started ... via client start, Continue-As-New, Child Workflow start"), counted once: in the child's own history
(its WorkflowExecutionStarted), not again as the parent's StartChildWorkflowExecutionInitiated."""

from __future__ import annotations

from collections.abc import Iterable

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

_ONE_EACH = frozenset(
    {
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
        EventType.EVENT_TYPE_TIMER_STARTED,
        EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,
        EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED,
    }
)
# Markers: a local activity (one action each) or a version marker (a patch: exempt, as its search attribute is).
_LOCAL_ACTIVITY_MARKER = "core_local_activity"


def actions_of(event: HistoryEvent) -> int:
    """The billable actions one history event stands for."""
    kind = event.event_type
    if kind in _ONE_EACH:
        return 1
    if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
        return max(event.activity_task_started_event_attributes.attempt, 1)
    if kind == EventType.EVENT_TYPE_MARKER_RECORDED:
        return int(event.marker_recorded_event_attributes.marker_name == _LOCAL_ACTIVITY_MARKER)
    return 0


def billable_actions(events: Iterable[HistoryEvent]) -> int:
    return sum(actions_of(event) for event in events)
