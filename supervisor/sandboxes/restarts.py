"""The restart budget of one sandbox: after a death, how long to wait before the next
start, and when to give up (`failed`). Pure: deaths are counted on an injected
clock and nothing here sleeps; the wait is the driver's
(supervisor/sandboxes/supervised.py), on the same `Clock`, so that
tests/test_lifecycle_model.py runs a sandbox's restarts on virtual time.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


class Clock(Protocol):
    """Where a sandbox reads the time and waits out a backoff."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    """The real one: the monotonic clock and the event loop's timers."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


MONOTONIC = MonotonicClock()


@dataclass(frozen=True, kw_only=True)
class RestartPolicy:
    """OTP-style: a sandbox that dies more than `max_restarts` times within
    `period_s` is `failed` until an operator restarts it. Between deaths it waits
    `backoff_initial_s * 2**(n-1)`, capped at `backoff_max_s`, where n counts the
    deaths inside the window. The one source of the restart defaults."""

    max_restarts: int = 5
    period_s: float = 60.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0

    def backoff(self, deaths: int) -> float:
        """The wait after the `deaths`-th death inside the window (from 1)."""
        return float(min(self.backoff_initial_s * 2 ** (deaths - 1), self.backoff_max_s))


@dataclass(kw_only=True)
class RestartBudget:
    """The deaths of one sandbox inside its policy's window. Created with its
    SupervisedSandbox and owned by it; an operator's restart forgives the past."""

    policy: RestartPolicy
    clock: Callable[[], float] = time.monotonic
    deaths: deque[float] = field(default_factory=deque)

    def death(self) -> float | None:
        """Count a death now and decide: the wait before the next start, or None
        when the budget is spent."""
        now = self.clock()
        self.deaths.append(now)
        while self.deaths and self.deaths[0] <= now - self.policy.period_s:
            self.deaths.popleft()
        if len(self.deaths) > self.policy.max_restarts:
            return None
        return self.policy.backoff(len(self.deaths))

    def left(self) -> int:
        """Deaths the budget still allows before `failed`."""
        now = self.clock()
        recent = sum(1 for d in self.deaths if d > now - self.policy.period_s)
        return max(self.policy.max_restarts - recent, 0)

    def forgive(self) -> None:
        """An operator's `clawsup restart` wipes the record of past deaths."""
        self.deaths.clear()
