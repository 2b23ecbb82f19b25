"""I/O: hold points for the failure-injection test bed - named places in the write path where an attempt
waits until the test lets it go, so two attempts (in one process or in two) meet at the worst moment every
time instead of by chance. A service passes FileHolds(directory) as the kit's `hold`; without it every point
passes at once.

The protocol is plain files, so it works across processes and never needs the database (whose write lock
the held attempt may be holding):
- the test arms a point by creating `<dir>/<point>.armed`;
- an attempt that reaches an armed point creates `<dir>/<point>.<pid>.<n>.reached` and waits;
- it goes on once `<dir>/<point>.release` exists, or after `timeout` seconds (a test that forgot it must
  not hang the service forever).
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

from toolloop.servicekit._ledger import HoldPoint


class FileHolds:
    """Hold points driven by files in `directory` (see the module docstring)."""

    def __init__(self, directory: str | Path, timeout: float = 20.0, poll: float = 0.02) -> None:
        self.directory = Path(directory)
        self.timeout = timeout
        self.poll = poll
        self._arrivals = itertools.count()

    def __call__(self, point: HoldPoint) -> None:
        if not (self.directory / f"{point}.armed").exists():
            return
        (self.directory / f"{point}.{os.getpid()}.{next(self._arrivals)}.reached").touch()
        deadline = time.monotonic() + self.timeout
        release = self.directory / f"{point}.release"
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(self.poll)


def reached(directory: str | Path, point: HoldPoint) -> list[Path]:
    """The arrivals at `point` so far (for the test driving it)."""
    return sorted(Path(directory).glob(f"{point}.*.reached"))
