"""Pure: the benchmark's count of Temporal Cloud billable actions from a run's history (bench/actions.py)."""

from __future__ import annotations

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import (
    ActivityTaskStartedEventAttributes,
    HistoryEvent,
    MarkerRecordedEventAttributes,
)

from bench.actions import billable_actions


def _event(kind: EventType.ValueType, **attributes: object) -> HistoryEvent:
    return HistoryEvent(event_type=kind, **attributes)  # type: ignore[arg-type]


def test_each_kind_of_action_counts_as_temporal_cloud_documents_it() -> None:
    e = EventType
    history = [
        _event(e.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED),  # 1
        _event(e.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED),  # workflow tasks are not actions
        _event(e.EVENT_TYPE_WORKFLOW_TASK_STARTED),
        _event(e.EVENT_TYPE_WORKFLOW_TASK_COMPLETED),
        _event(e.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED),
        # the third attempt started: two retries before it, three actions
        _event(
            e.EVENT_TYPE_ACTIVITY_TASK_STARTED,
            activity_task_started_event_attributes=ActivityTaskStartedEventAttributes(attempt=3),
        ),
        _event(e.EVENT_TYPE_ACTIVITY_TASK_COMPLETED),
        _event(e.EVENT_TYPE_TIMER_STARTED),  # 1
        _event(e.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED),  # 1
        _event(e.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED),  # the same update
        _event(e.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES),  # 1
        _event(e.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED),  # 1
        _event(
            e.EVENT_TYPE_MARKER_RECORDED,
            marker_recorded_event_attributes=MarkerRecordedEventAttributes(marker_name="core_local_activity"),
        ),  # 1
        _event(
            e.EVENT_TYPE_MARKER_RECORDED,
            marker_recorded_event_attributes=MarkerRecordedEventAttributes(marker_name="core_patch"),
        ),  # a version marker is exempt
        _event(e.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED),
    ]
    assert billable_actions(history) == 1 + 3 + 1 + 1 + 1 + 1 + 1


def test_an_activity_that_started_once_is_one_action() -> None:
    started = _event(
        EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED,
        activity_task_started_event_attributes=ActivityTaskStartedEventAttributes(attempt=1),
    )
    assert billable_actions([started, started]) == 2


def test_a_child_workflows_start_is_one_action_counted_in_the_childs_history() -> None:
    e = EventType
    parent = [
        _event(e.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED),  # 1: the parent's own start
        _event(e.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED),  # the child's start, counted in the child
        _event(e.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED),
        _event(e.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED),
    ]
    child = [_event(e.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED)]  # 1
    assert billable_actions(parent) + billable_actions(child) == 2
