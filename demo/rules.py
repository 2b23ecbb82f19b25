"""Pure: the demo's business rules that both sides check - the service on the bodies it receives, the tools on
the arguments the model sends (so a bad value is refused before anything is approved): id formats, addresses,
and what makes a calendar event."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

from pydantic import StringConstraints, ValidationInfo
from pydantic_core import PydanticCustomError

ORDER_ID = r"^A[0-9]{3}$"
TICKET_ID = r"^T[0-9]{4}$"
CALENDAR_ID = r"^cal-[a-z0-9-]{1,32}$"
# An account money goes to or comes from, e.g. acct-u1-0001.
ACCOUNT = r"^acct-[a-z0-9-]{1,40}$"
MAX_SAFE_INTEGER = 2**53 - 1
MAX_EVENT_DURATION = timedelta(hours=8)
# A deliberately plain shape: local@domain.tld, ASCII only (no look-alike or invisible characters).
EMAIL = r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}$"

Email = Annotated[str, StringConstraints(max_length=254, pattern=EMAIL)]


def whole_second(value: datetime) -> datetime:
    """Event times are stored at second precision; a fraction would make the read-back differ."""
    if value.microsecond:
        raise PydanticCustomError("whole_seconds", "must be a whole second")
    return value


def event_end(end: datetime, info: ValidationInfo) -> datetime:
    """An event ends after it starts, at most 8 hours later (use as a field validator of `end`)."""
    start = info.data.get("start")
    if start is not None and end <= start:
        raise PydanticCustomError("time_range", "must be later than start")
    if start is not None and end - start > MAX_EVENT_DURATION:
        raise PydanticCustomError("time_range", "an event may last at most 8 hours")
    return end
