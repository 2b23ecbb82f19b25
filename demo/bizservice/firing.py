"""Pure: when a fault fires among the calls it matches - the Nth one (and the `times` after it), or each
one with a probability drawn from a seed. Standard library only, so the business service's fault rules and
the test bed (faultbed: its proxy and runner, which import it from here: the service never imports the test
bed) decide with this one function, in any process, with the same answer for the same seed."""

from __future__ import annotations

import hashlib


def fires(
    call_number: int,
    *,
    skip: int = 0,
    times: int | None = None,
    fired_before: int = 0,
    probability: float | None = None,
    seed: int = 0,
    label: str = "",
) -> bool:
    """Whether a fault fires on its `call_number`-th matching call (1-based): never on the first `skip`,
    never after it has fired `times` times, and (with `probability`) only where the seeded draw says so."""
    if call_number <= skip or (times is not None and fired_before >= times):
        return False
    return probability is None or draw(seed, label, call_number) < probability


def draw(seed: int, label: str, call_number: int) -> float:
    """A number in [0, 1) that depends only on its arguments: the same in every process and every run
    (never Python's salted `hash` or a shared random state)."""
    digest = hashlib.sha256(f"{seed}:{label}:{call_number}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64
