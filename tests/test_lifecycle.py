"""The state machine, one test per edge, and the restart policy on an injected clock."""

from __future__ import annotations

from collections import deque

import pytest

from clawsup.sandbox.launch.launcher import ExitStatus
from clawsup.supervisor.sandboxes.lifecycle import EDGES, IllegalTransition, Lifecycle, RestartPolicy, SandboxState, Transition

S = SandboxState


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lifecycle_at(state: SandboxState, clock: FakeClock | None = None) -> Lifecycle:
    lc = Lifecycle(sandbox_id="p-1", policy=RestartPolicy(), clock=clock or FakeClock())
    lc.state = state  # test setup only: the edge under test goes through enter()
    return lc


ALLOWED = [(old, new) for old, targets in EDGES.items() for new in sorted(targets, key=lambda s: s.value)]
FORBIDDEN = [(old, new) for old in S for new in S if new not in EDGES[old]]


@pytest.mark.parametrize(("old", "new"), ALLOWED, ids=[f"{o.value}->{n.value}" for o, n in ALLOWED])
def test_allowed_edge(old: SandboxState, new: SandboxState) -> None:
    lc = lifecycle_at(old)
    seen: list[Transition] = []
    lc.listeners.append(seen.append)
    t = lc.enter(new, "because")
    assert lc.state is new and lc.seq == 1
    assert seen == [t] and (t.old, t.new, t.why) == (old, new, "because")


@pytest.mark.parametrize(("old", "new"), FORBIDDEN, ids=[f"{o.value}->{n.value}" for o, n in FORBIDDEN])
def test_forbidden_edge(old: SandboxState, new: SandboxState) -> None:
    lc = lifecycle_at(old)
    with pytest.raises(IllegalTransition):
        lc.enter(new)
    assert lc.state is old and lc.seq == 0


def test_every_state_can_be_left_and_stopped_is_reachable() -> None:
    assert all(EDGES[s] for s in S)
    assert all(S.STOPPED in EDGES[s] or S.DRAINING in EDGES[s] or s in (S.STOPPED, S.DRAINING) for s in S)


def test_uptime_starts_at_ready_and_ends_when_leaving_it() -> None:
    clock = FakeClock()
    lc = lifecycle_at(S.STARTING, clock)
    lc.enter(S.READY)
    assert lc.started_at == 1000.0
    clock.now += 5
    lc.enter(S.CRASHED)
    assert lc.started_at is None


def test_backoff_doubles_until_capped() -> None:
    policy = RestartPolicy(max_restarts=10, period_s=1000, backoff_initial_s=0.5, backoff_max_s=3)
    deaths: deque[float] = deque()
    delays = []
    for i in range(6):
        deaths.append(float(i))
        delays.append(policy.next_delay(deaths, float(i)))
    assert delays == [0.5, 1.0, 2.0, 3, 3, 3]


def test_too_many_deaths_within_period_fail() -> None:
    clock = FakeClock()
    lc = Lifecycle(sandbox_id="p-1", policy=RestartPolicy(max_restarts=2, period_s=60), clock=clock)
    assert lc.record_death(ExitStatus(code=1)) is not None
    clock.now += 1
    assert lc.record_death(ExitStatus(code=1)) is not None
    assert lc.restarts_left() == 0
    clock.now += 1
    assert lc.record_death(ExitStatus(signal=9)) is None
    assert lc.last_exit == ExitStatus(signal=9)


def test_deaths_outside_the_period_are_forgotten() -> None:
    clock = FakeClock()
    lc = Lifecycle(sandbox_id="p-1", policy=RestartPolicy(max_restarts=1, period_s=60, backoff_initial_s=1), clock=clock)
    assert lc.record_death(ExitStatus(code=1)) == 1
    clock.now += 61
    # The first death left the window: this one is again the first, with the first delay.
    assert lc.record_death(ExitStatus(code=1)) == 1
    assert lc.restarts_left() == 0


def test_operator_restart_forgives() -> None:
    clock = FakeClock()
    lc = Lifecycle(sandbox_id="p-1", policy=RestartPolicy(max_restarts=0), clock=clock)
    assert lc.record_death(ExitStatus(code=1)) is None
    lc.forgive()
    assert lc.restarts_left() == 0 and not lc.deaths


def test_exit_status_sentences() -> None:
    assert ExitStatus(signal=11).describe() == "was killed by SIGSEGV"
    assert ExitStatus(code=3, reason="bad handshake").describe() == "exited with code 3 (bad handshake)"
    assert ExitStatus(signal=9, reason="memory limit").to_json()["text"] == "was killed by SIGKILL (memory limit)"
