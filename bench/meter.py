"""I/O: what the benchmark's processes cost - CPU seconds (user + system) and resident memory, read with
psutil, plus this process's own CPU (the client). A background thread samples each watched process's RSS
so a phase's peak is known without asking the process."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import psutil

CLIENT = "client"
_SAMPLE_SECONDS = 0.05


@dataclass
class Window:
    """CPU seconds spent by each process between the start and the end of a `with meter.window()` block."""

    cpu: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    # CPU seconds every other process on the machine spent meanwhile (a shared machine perturbs the figures).
    others_s: float = 0.0

    @property
    def other_load_cores(self) -> float | None:
        """How many cores the other processes kept busy on average during the window."""
        return self.others_s / self.wall_s if self.wall_s > 0 else None


def _machine_busy_seconds() -> float:
    """CPU seconds all processes of the machine have spent so far (every state but idle and I/O wait)."""
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))


class ProcessMeter:
    def __init__(self) -> None:
        self._procs: dict[str, psutil.Process] = {}
        self._peaks: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rss-sampler", daemon=True)

    def __enter__(self) -> ProcessMeter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def watch(self, name: str, pid: int) -> None:
        """Measure `pid` under `name` from now on (a restarted worker replaces its predecessor)."""
        with self._lock:
            self._procs[name] = psutil.Process(pid)
            self._peaks[name] = 0

    def cpu_seconds(self) -> dict[str, float]:
        """User + system CPU seconds so far of every watched process that is alive, and of this one."""
        with self._lock:
            procs = dict(self._procs)
        out = {CLIENT: time.process_time()}
        for name, proc in procs.items():
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            out[name] = times.user + times.system
        return out

    def rss(self, name: str) -> int | None:
        with self._lock:
            proc = self._procs.get(name)
        if proc is None:
            return None
        try:
            return int(proc.memory_info().rss)
        except psutil.Error:
            return None

    def reset_peaks(self) -> None:
        with self._lock:
            self._peaks = {name: 0 for name in self._procs}
        for name in list(self._peaks):
            self._note(name)

    def peak(self, name: str) -> int | None:
        self._note(name)
        with self._lock:
            value = self._peaks.get(name)
        return value or None

    @contextmanager
    def window(self) -> Iterator[Window]:
        """CPU per process over the block (processes that died meanwhile are left out)."""
        window = Window()
        before, busy_before, started = self.cpu_seconds(), _machine_busy_seconds(), time.perf_counter()
        yield window
        after, busy_after = self.cpu_seconds(), _machine_busy_seconds()
        window.wall_s = time.perf_counter() - started
        window.cpu = {name: after[name] - before[name] for name in after if name in before}
        window.others_s = max(busy_after - busy_before - sum(window.cpu.values()), 0.0)

    def _note(self, name: str) -> None:
        value = self.rss(name)
        if value is None:
            return
        with self._lock:
            if value > self._peaks.get(name, 0):
                self._peaks[name] = value

    def _sample(self) -> None:
        while not self._stop.wait(_SAMPLE_SECONDS):
            with self._lock:
                names = list(self._procs)
            for name in names:
                self._note(name)
