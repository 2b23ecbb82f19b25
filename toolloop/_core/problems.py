"""Pure: the write protocol's error answers, written once for both sides of the wire - the service kit
(toolloop.servicekit) answers with these problem codes, and toolloop's HTTP write contract
(toolloop/_tools/http.py) reads them; and the field hints an invalid body gets, in the kit, the demo service
and the HTTP API alike. The approval codes live with the token (toolloop/_core/approvals.py); APPROVAL_REQUIRED
is re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from toolloop._core.approvals import APPROVAL_REQUIRED as APPROVAL_REQUIRED  # 403: no valid approval for this write

PROBLEM_MEDIA_TYPE = "application/problem+json"

# The problem codes of the idempotency protocol: each one changes what a client does next.
KEY_REQUIRED = "IDEMPOTENCY_KEY_REQUIRED"  # 400: the write was sent without a usable operation id
KEY_REUSED = "IDEMPOTENCY_KEY_REUSED"  # 422: the operation id was used for another payload
IN_PROGRESS = "IN_PROGRESS"  # 409: another attempt with this operation id holds its claim; ask again later
# The kit's other answers: the client treats them by their status.
ACTOR_REQUIRED = "ACTOR_REQUIRED"  # 401: the service could not tell who is calling
INVALID_BODY = "INVALID_BODY"  # 422
BODY_TOO_LARGE = "BODY_TOO_LARGE"  # 413

# The longest detail a service writes per field and a client passes on to the model.
MAX_DETAIL_CHARS = 200
_MAX_ERRORS_SHOWN = 5


def describe_errors(errors: Sequence[Mapping[str, Any]]) -> str:
    """Field-by-field hints from pydantic's errors; never the input values (they may be huge, hostile or
    someone's data)."""
    parts = []
    for err in errors[:_MAX_ERRORS_SHOWN]:
        loc = [str(p) for p in err.get("loc", ())]
        kind = err.get("type")
        msg = {"missing": "is required", "extra_forbidden": "is not an accepted field"}.get(
            str(kind), str(err.get("msg", "is invalid"))
        )
        parts.append(f"{'.'.join(loc) or 'body'}: {msg}"[:MAX_DETAIL_CHARS])
    if len(errors) > _MAX_ERRORS_SHOWN:
        parts.append(f"and {len(errors) - _MAX_ERRORS_SHOWN} more")
    return "; ".join(parts)
