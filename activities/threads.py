"""Activity side (I/O): what a thread's workflow reads of a message's request besides its report - the ledger
of a request that ended without one (terminated, timed out), through the request's own ledger query."""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from toolloop._core.contracts import OperationRecord
from toolloop._core.names import GET_LEDGER_QUERY, REQUEST_LEDGER_ACTIVITY
from toolloop._core.threads import LedgerOfRequest


@activity.defn(name=REQUEST_LEDGER_ACTIVITY)
async def request_ledger(request: LedgerOfRequest) -> list[OperationRecord]:
    """The request's operations as its ledger last recorded them (a query a worker answers by replaying the
    closed run). Any failure is tried again (the thread waits for it), except a request whose history is gone."""
    handle = activity.client().get_workflow_handle(request.workflow_id)
    try:
        ledger: list[OperationRecord] = await handle.query(GET_LEDGER_QUERY, result_type=list[OperationRecord])
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise ApplicationError(f"no request {request.workflow_id} any more", non_retryable=True) from None
        raise
    return ledger
