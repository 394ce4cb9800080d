"""A debugging aid for the gateway's event loop. With `CLAWSUP_LOOP_DEBUG_MS=50` in
its environment, `clawsup start` runs the loop in asyncio's debug mode with
`slow_callback_duration` 50 ms, and writes each of asyncio's reports to
supervisor.log as one WARNING line, with what the loop thread did meanwhile:

    asyncio: Executing <Task ... coro=<...() running at /…/supervisor/control/gateway.py:298>> took 0.070 seconds
    [blocking call, held the loop: own 0.065 s = cpu 0.002 + off cpu 0.064 (asleep in hrtimer_nanosleep);
    garbage collector 0.000 s; asyncio debug mode 0.000 s; waiting for a CPU 0.004 s] at sandbox/launch/process.py:289 in close
    < supervisor/control/gateway.py:298 in run_gateway | loop_watch {json}

Why the bracket. A callback's wall time is its time on a CPU, plus its time runnable
but waiting for a CPU (preempted: the machine is busy, not our code), plus its time
asleep in the kernel: in a blocking call (a docker request, a waitpid, a read), or
waiting for the GIL that another thread holds. Thread CPU time alone cannot tell a
blocking call from a preemption, since the thread is off CPU in both; the kernel's
per-thread schedstat can, as its `run_delay` counts only the time runnable and not
running. What is left off CPU is a blocking call only if a sample caught the thread
asleep in one: while the loop thread sleeps in a call that released the GIL, the
sampler (below) runs and reads its kernel wait channel (`do_wait`,
`unix_stream_read_generic`, `submit_bio_wait`...); while it waits for the GIL, the
sampler cannot run either, or sees a futex wait outside any Python-level lock. The
cyclic garbage collector's pauses land in whichever callback allocates at the wrong
moment (and debug mode allocates a stack summary per handle), and debug mode's own
recording of where each handle and future was created costs CPU in the callback that
creates them (estimated from the samples taken in it): both counted apart.

So a callback "held the loop" when the CPU time of its own code reaches the threshold,
or its own time (that, plus off CPU) does with a sample asleep in a blocking call.
Preemption, GIL waits, collector pauses and debug mode's cost are reported, not blamed
on the callback. tests/test_event_loop.py checks each case.

"at ..." is where the loop thread was: a sampler thread takes its Python stack and
wait channel every fifth of the threshold once a callback has run that long, and the
line names the clawsup frames seen most often (asyncio's own text names only the
task's outermost coroutine and where it next waits). The JSON after `loop_watch `
carries everything, samples included, for tools (tests/test_event_loop.py).

Installed once by `run_gateway`, on its loop; the sampler thread ends when the loop
closes. Every callback of that loop is measured (`Handle._run` is wrapped), for some
ten microseconds each: a debugging mode, not for production.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from loguru import logger

import clawsup.sandbox
import clawsup.supervisor

from clawsup.supervisor.errors import ClawsupError

ENV = "CLAWSUP_LOOP_DEBUG_MS"
MAX_MS = 10_000
MAX_SAMPLES = 20
ROOT = Path(clawsup.supervisor.__file__).resolve().parent.parent
"""The folder that holds supervisor/ and sandbox/ (the checkout, or the installed
`clawsup` package): frames are shown relative to it."""
OURS = tuple(str(Path(p).resolve().parent) + os.sep for p in (clawsup.supervisor.__file__, clawsup.sandbox.__file__))


def threshold_from_env(environ: Mapping[str, str] = os.environ) -> float | None:
    """`CLAWSUP_LOOP_DEBUG_MS` in seconds, or None when unset or empty."""
    raw = environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        ms = float(raw)
    except ValueError:
        ms = -1.0
    if not 0 < ms <= MAX_MS:
        raise ClawsupError(f"{ENV} must be a number of milliseconds between 0 and {MAX_MS}, such as 50 (got {raw!r})")
    return ms / 1000


def watch_loop_from_env() -> None:
    """The hook `run_gateway` calls first, on its loop."""
    if (threshold := threshold_from_env()) is not None:
        LoopWatch(asyncio.get_running_loop(), threshold).install()


@dataclass(kw_only=True)
class Sample:
    at_s: float
    """How long the callback had run when the sample was taken."""
    wchan: str
    stack: list[tuple[str, int, str]]
    """Innermost frame first, down to the callback's own."""


# Where asyncio's debug mode records a handle's or a future's origin (C futures call
# traceback.extract_stack): its cost, not the callback's.
DEBUG_MACHINERY = {(f"{os.sep}asyncio{os.sep}format_helpers.py", "extract_stack"), (f"{os.sep}traceback.py", "extract_stack")}
# Python-level waits on a lock, whose futex sleep is a blocking call of the callback's
# (a futex elsewhere is the GIL).
LOCK_WAITS = (f"{os.sep}threading.py", f"{os.sep}queue.py", f"{os.sep}concurrent{os.sep}futures{os.sep}_base.py")


@dataclass(kw_only=True)
class Measure:
    handle: asyncio.Handle
    threshold_s: float
    wall_s: float
    cpu_s: float
    gc_s: float
    """CPU time in the cyclic garbage collector."""
    waiting_for_cpu_s: float | None
    """None where the kernel keeps no schedstat."""
    samples: list[Sample] = field(default_factory=list)

    @property
    def off_cpu_s(self) -> float:
        # The wait is read just outside the wall-clock interval (see LoopWatch.run),
        # so that a preemption at its edge cannot count as ours: it may then exceed
        # the interval's own wait by that edge, hence the floor.
        return max(0.0, self.wall_s - (self.waiting_for_cpu_s or 0.0) - self.cpu_s)

    @property
    def debug_s(self) -> float:
        """asyncio's debug mode's share of the CPU time, estimated from the samples
        taken in its origin-recording code."""
        if not self.samples:
            return 0.0
        inside = sum(1 for s in self.samples if any(f[0].endswith(path) and f[2] == fn for f in s.stack for path, fn in DEBUG_MACHINERY))
        return (self.cpu_s - self.gc_s) * inside / len(self.samples)

    @property
    def computing_s(self) -> float:
        """CPU time of the callback's own code."""
        return self.cpu_s - self.gc_s - self.debug_s

    @property
    def own_s(self) -> float:
        """What the callback cost the loop on a machine of its own: its code's CPU
        time, and its time asleep (in a blocking call, or for the GIL)."""
        return self.computing_s + self.off_cpu_s

    @property
    def asleep(self) -> list[str]:
        """The blocking waits the samples caught the thread in."""
        out = []
        for s in self.samples:
            if s.wchan.startswith("futex"):
                if s.stack and s.stack[0][0].endswith(LOCK_WAITS):
                    out.append(f"{s.wchan} in {s.stack[0][2]}")
            elif s.wchan not in ("running", "?"):
                out.append(s.wchan)
        return out

    @property
    def held(self) -> bool:
        return self.computing_s >= self.threshold_s or (self.own_s >= self.threshold_s and bool(self.asleep))

    @property
    def cause(self) -> str:
        """Why the loop was held, else the largest part of the wall time."""
        if self.held:
            return "computing" if self.computing_s >= self.threshold_s else "blocking call"
        parts = {
            "computing": self.computing_s,
            "blocking call" if self.asleep else "waiting for the GIL": self.off_cpu_s,
            "garbage collector": self.gc_s,
            "asyncio debug mode": self.debug_s,
            "waiting for a CPU": self.waiting_for_cpu_s or 0.0,
        }
        return max(parts, key=lambda k: parts[k])


def _short(path: str) -> str:
    return path[len(str(ROOT)) + 1 :] if path.startswith(OURS) else path


def where(samples: list[Sample]) -> list[tuple[str, int, str]]:
    """The clawsup frames of the sample seen most often (innermost first): the code
    that held the loop. Empty when no sample reached our code."""
    counts: dict[tuple[tuple[str, int, str], ...], int] = {}
    for s in samples:
        ours = tuple(f for f in s.stack if f[0].startswith(OURS) and f[0] != __file__)
        if ours:
            counts[ours] = counts.get(ours, 0) + 1
    return list(max(counts.items(), key=lambda kv: kv[1])[0]) if counts else []


def callback_source(handle: asyncio.Handle) -> tuple[str, int, str] | None:
    """Where the callback's code is: a task's coroutine, or the function (asyncio's
    text gives no file for a bound method)."""
    cb: Any = handle._callback  # type: ignore[attr-defined]
    owner = getattr(cb, "__self__", None)
    if isinstance(owner, asyncio.Task):
        coro = owner.get_coro()
        code = getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None)
    else:
        while isinstance(cb, functools.partial):
            cb = cb.func
        code = getattr(getattr(cb, "__func__", cb), "__code__", None)
    return (code.co_filename, code.co_firstlineno, code.co_qualname) if code is not None else None


class LoopWatch:
    """Created and installed by `watch_loop_from_env`, on the loop's own thread; lives
    as long as the loop (its sampler thread ends when the loop closes)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, threshold_s: float) -> None:
        self.loop = loop
        self.threshold_s = threshold_s
        self.period_s = max(0.002, threshold_s / 5)
        self.thread = threading.current_thread()
        self._tid = threading.get_ident()
        self._lock = threading.Lock()
        self._seq = 0
        self._running: tuple[int, float] | None = None
        self._samples: list[Sample] = []
        self._last: tuple[asyncio.Handle, float, float, float, float | None, list[Sample]] | None = None
        self._gc_ns = 0
        self._gc_start: int | None = None
        self._schedstat = self._open("/proc/thread-self/schedstat")
        self._wchan_path = f"/proc/self/task/{threading.get_native_id()}/wchan"

    @staticmethod
    def _open(path: str) -> int | None:
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None

    def _run_delay_ns(self) -> int | None:
        # Field 2 of schedstat: time runnable but not running. Read by the thread
        # itself, it is up to date (the kernel adds a wait when the thread gets a CPU).
        if self._schedstat is None:
            return None
        try:
            return int(os.pread(self._schedstat, 64, 0).split()[1])
        except (OSError, IndexError, ValueError):
            return None

    def install(self) -> None:
        loop = self.loop
        loop.set_debug(True)
        loop.slow_callback_duration = self.threshold_s
        _WATCHED[loop] = self
        asyncio.events.Handle._run = _measured_run  # type: ignore[method-assign]
        # asyncio reports through the stdlib logger "asyncio"; ours is loguru.
        log = logging.getLogger("asyncio")
        log.addHandler(_ToLoguru(self))
        log.setLevel(logging.WARNING)
        log.propagate = False
        gc.callbacks.append(self._on_gc)
        threading.Thread(target=self._sample, name="loop watch", daemon=True).start()
        logger.warning(
            "{}={:g}: the event loop runs in asyncio debug mode, and every callback that holds it {:g} ms or more is logged "
            "(a debugging aid; it slows the gateway)",
            ENV, self.threshold_s * 1000, self.threshold_s * 1000,
        )  # fmt: skip

    # -- the loop thread ---------------------------------------------------------
    def run(self, handle: asyncio.Handle) -> None:
        self._seq += 1
        seq = self._seq
        delay0 = self._run_delay_ns()
        gc0 = self._gc_ns
        cpu0 = time.thread_time_ns()
        t0 = time.monotonic()
        with self._lock:
            self._running = (seq, t0)
            self._samples = []
        try:
            _original_run(handle)
        finally:
            wall = time.monotonic() - t0
            cpu = (time.thread_time_ns() - cpu0) / 1e9
            delay1 = self._run_delay_ns()
            with self._lock:
                self._running = None
                samples, self._samples = self._samples, []
            # Kept raw for every callback (asyncio's clock and ours differ by a hair at
            # the threshold); `report` makes a Measure of the ones asyncio reports.
            waited = (delay1 - delay0) / 1e9 if delay0 is not None and delay1 is not None else None
            self._last = (handle, wall, cpu, (self._gc_ns - gc0) / 1e9, waited, samples)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if threading.get_ident() != self._tid:
            return
        if phase == "start":
            self._gc_start = time.thread_time_ns()
        elif self._gc_start is not None:
            self._gc_ns += time.thread_time_ns() - self._gc_start
            self._gc_start = None

    # -- the sampler thread ------------------------------------------------------
    def _sample(self) -> None:
        callback_base = _original_run.__code__
        while not self.loop.is_closed():
            time.sleep(self.period_s)
            running = self._running
            if running is None or time.monotonic() - running[1] < self.period_s:
                continue
            # The frames above asyncio's Handle._run: the callback's own. A thread not
            # under it is in our measuring code, before or after the callback.
            stack: list[tuple[str, int, str]] = []
            f: FrameType | None = sys._current_frames().get(self._tid)
            while f is not None and f.f_code is not callback_base:
                stack.append((f.f_code.co_filename, f.f_lineno, f.f_code.co_name))
                f = f.f_back
            inside = f is not None
            del f
            if not inside:
                continue
            try:
                with open(self._wchan_path) as w:
                    wchan = w.read().strip() or "running"
            except OSError:
                wchan = "?"
            sample = Sample(at_s=time.monotonic() - running[1], wchan="running" if wchan == "0" else wchan, stack=stack)
            with self._lock:
                if self._running == running and len(self._samples) < MAX_SAMPLES:
                    self._samples.append(sample)
        _WATCHED.pop(self.loop, None)
        if self._schedstat is not None:
            with contextlib.suppress(OSError):
                os.close(self._schedstat)

    # -- the report --------------------------------------------------------------
    def report(self, text: str, handle: asyncio.Handle | None) -> str:
        last, self._last = self._last, None
        if last is None or last[0] is not handle:
            return text
        _, wall, cpu, gc_s, waited_s, samples = last
        m = Measure(handle=handle, threshold_s=self.threshold_s, wall_s=wall, cpu_s=cpu, gc_s=gc_s, waiting_for_cpu_s=waited_s, samples=samples)
        at = where(m.samples)
        asleep = sorted(set(m.asleep))
        waited = "unknown" if m.waiting_for_cpu_s is None else f"{m.waiting_for_cpu_s:.3f} s"
        human = (
            f"{text} [{m.cause}{', held the loop' if m.held else ''}: own {m.own_s:.3f} s = cpu {m.computing_s:.3f} + off cpu {m.off_cpu_s:.3f}"
            + (f" (asleep in {', '.join(asleep)})" if asleep else "")
            + f"; garbage collector {m.gc_s:.3f} s; asyncio debug mode {m.debug_s:.3f} s; waiting for a CPU {waited}]"
            + (" at " + " < ".join(f"{_short(p)}:{n} in {fn}" for p, n, fn in at[:3]) if at else "")
        )
        data: dict[str, Any] = {
            "held": m.held,
            "cause": m.cause,
            "wall_s": round(m.wall_s, 4),
            "own_s": round(m.own_s, 4),
            "cpu_s": round(m.computing_s, 4),
            "off_cpu_s": round(m.off_cpu_s, 4),
            "asleep": m.asleep,
            "gc_s": round(m.gc_s, 4),
            "debug_s": round(m.debug_s, 4),
            "waiting_for_cpu_s": None if m.waiting_for_cpu_s is None else round(m.waiting_for_cpu_s, 4),
            "where": [list(f) for f in at],
            "callback": callback_source(handle),
            "samples": [{"at_s": round(s.at_s, 4), "wchan": s.wchan, "stack": [list(f) for f in s.stack]} for s in m.samples],
        }
        return f"{human} | loop_watch {json.dumps(data)}"


_WATCHED: dict[asyncio.AbstractEventLoop, LoopWatch] = {}
_original_run = asyncio.events.Handle._run


def _measured_run(self: asyncio.Handle) -> None:
    """Handle._run, measured on a watched loop's thread (installed in its place)."""
    watch = _WATCHED.get(self._loop)  # type: ignore[attr-defined]
    if watch is None or threading.current_thread() is not watch.thread:
        _original_run(self)
    else:
        watch.run(self)


class _ToLoguru(logging.Handler):
    """asyncio's records into the supervisor's log; a slow-callback report gets the
    measurements of the callback it names (asyncio logs it right after the callback,
    on the loop's thread, while `_current_handle` is still that callback)."""

    def __init__(self, watch: LoopWatch) -> None:
        super().__init__(logging.WARNING)
        self.watch = watch

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.msg == "Executing %s took %.3f seconds":
            try:
                text = self.watch.report(text, getattr(self.watch.loop, "_current_handle", None))
            except Exception as e:  # a debugging aid must not take the loop down
                text += f" (loop watch failed: {type(e).__name__}: {e})"
        level = record.levelname if record.levelname in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL") else "WARNING"
        exc = record.exc_info[1] if record.exc_info else None
        logger.opt(exception=exc).log(level, "asyncio: {}", text)
