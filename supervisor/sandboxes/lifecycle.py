"""The sandbox lifecycle: one state enum, one table of allowed edges, one method that
enters a state. Nothing else changes a sandbox's state.

    stopped  → starting → ready → draining → stopped
    starting | ready → crashed → backoff → starting
    crashed → failed  (restart budget spent; `clawsup restart` → starting)

Events drive it (child exit, handshake line, health answer, backoff timer); there is
no periodic scan. Each edge has its test in tests/test_lifecycle.py. When to restart
and when to give up is the restart budget's (supervisor/sandboxes/restarts.py).
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from loguru import logger

from clawsup.sandbox.launch.launcher import ExitStatus
# Importers older than restarts.py find the policy here too.


class SandboxState(enum.Enum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    CRASHED = "crashed"
    BACKOFF = "backoff"
    FAILED = "failed"


S = SandboxState
EDGES: dict[SandboxState, frozenset[SandboxState]] = {
    S.STOPPED: frozenset({S.STARTING}),
    # draining from starting: an operator stop or a gateway shutdown mid-start.
    S.STARTING: frozenset({S.READY, S.CRASHED, S.DRAINING}),
    S.READY: frozenset({S.DRAINING, S.CRASHED}),
    S.DRAINING: frozenset({S.STOPPED}),
    S.CRASHED: frozenset({S.BACKOFF, S.FAILED, S.STOPPED}),
    S.BACKOFF: frozenset({S.STARTING, S.STOPPED}),
    S.FAILED: frozenset({S.STARTING, S.STOPPED}),
}
ALIVE = frozenset({S.STARTING, S.READY, S.DRAINING})


class IllegalTransition(RuntimeError):
    pass


@dataclass(frozen=True, kw_only=True)
class Transition:
    sandbox_id: str
    old: SandboxState
    new: SandboxState
    why: str
    at: float


@dataclass(kw_only=True)
class Lifecycle:
    """The state of one sandbox and the record that goes with it. Owned by its
    SupervisedSandbox; `enter` is the only way to change `state`."""

    sandbox_id: str
    clock: Callable[[], float] = time.monotonic
    listeners: list[Callable[[Transition], None]] = field(default_factory=list)
    state: SandboxState = S.STOPPED
    restarts: int = 0
    """Starts after the first one, over the sandbox's whole life."""
    started_at: float | None = None
    """When the current incarnation became ready."""
    last_exit: ExitStatus | None = None
    seq: int = 0
    """Counts transitions, so a waiter can tell a new state from an old one."""
    why: str = ""
    """Why it entered its present state (the last transition's reason), for status."""
    recent: deque[tuple[int, SandboxState]] = field(default_factory=lambda: deque(maxlen=32))
    """The last transitions, (seq, state entered): a waiter woken after two quick
    ones (crashed, then backoff) still sees the first."""

    def enter(self, new: SandboxState, why: str = "") -> Transition:
        old = self.state
        if new not in EDGES[old]:
            raise IllegalTransition(f"{self.sandbox_id}: {old.value} → {new.value} is not an allowed edge ({why})")
        self.state = new
        self.why = why
        self.seq += 1
        self.recent.append((self.seq, new))
        now = self.clock()
        if new is S.READY:
            self.started_at = now
        elif old is S.READY:
            self.started_at = None
        t = Transition(sandbox_id=self.sandbox_id, old=old, new=new, why=why, at=now)
        # `failed` is the one state nobody leaves by themselves: an operator must act,
        # so it is said at error level, where they look.
        level = "ERROR" if new is S.FAILED else "INFO"
        logger.bind(transition=True).log(level, "{}: {} → {}{}", self.sandbox_id, old.value, new.value, f" ({why})" if why else "")
        for listen in self.listeners:
            listen(t)
        return t

    def first_since(self, after: int, states: frozenset[SandboxState]) -> SandboxState | None:
        """The first of `states` entered by a transition numbered above `after`."""
        for seq, state in self.recent:
            if seq > after and state in states:
                return state
        return None
