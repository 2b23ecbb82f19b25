"""Activity side (I/O): what a thread's workflow reads of a message's request besides its report - the ledger
of a request that ended without one (terminated, timed out), through the request's own ledger query."""

from __future__ import annotations

from temporalio import activity

from toolloop._core.contracts import OperationRecord
from toolloop._core.names import GET_LEDGER_QUERY, REQUEST_LEDGER_ACTIVITY
from toolloop._core.threads import LedgerOfRequest


@activity.defn(name=REQUEST_LEDGER_ACTIVITY)
async def request_ledger(request: LedgerOfRequest) -> list[OperationRecord]:
    """The request's operations as its ledger last recorded them (a query a worker answers by replaying the
    closed run)."""
    handle = activity.client().get_workflow_handle(request.workflow_id)
    ledger: list[OperationRecord] = await handle.query(GET_LEDGER_QUERY, result_type=list[OperationRecord])
    return ledger
