"""The state machine, one test per edge, and the restart budget on an injected clock.

The edges are checked against the table below, written here from the design
(DESIGN.md, supervisor/sandboxes/lifecycle.py's docstring), not read from the
module: an edge added to or dropped from the module's table fails a test."""

from __future__ import annotations


import pytest

from clawsup.sandbox.launch.launcher import ExitStatus
from clawsup.supervisor.sandboxes.lifecycle import IllegalTransition, Lifecycle, SandboxState, Transition
from clawsup.supervisor.sandboxes.restarts import RestartBudget, RestartPolicy

S = SandboxState


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lifecycle_at(state: SandboxState, clock: FakeClock | None = None) -> Lifecycle:
    lc = Lifecycle(sandbox_id="p-1", clock=clock or FakeClock())
    lc.state = state  # test setup only: the edge under test goes through enter()
    return lc


ALLOWED = [
    (S.STOPPED, S.STARTING),
    (S.STARTING, S.READY),
    (S.STARTING, S.CRASHED),
    (S.STARTING, S.DRAINING),  # an operator stop or a gateway shutdown mid-start
    (S.READY, S.DRAINING),
    (S.READY, S.CRASHED),
    (S.DRAINING, S.STOPPED),
    (S.CRASHED, S.BACKOFF),
    (S.CRASHED, S.FAILED),  # the restart budget is spent
    (S.CRASHED, S.STOPPED),
    (S.BACKOFF, S.STARTING),
    (S.BACKOFF, S.STOPPED),
    (S.FAILED, S.STARTING),  # `clawsup restart`
    (S.FAILED, S.STOPPED),
]
FORBIDDEN = [(old, new) for old in S for new in S if (old, new) not in ALLOWED]


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
    leaving = {old for old, _ in ALLOWED}
    assert leaving == set(S)
    assert all((s, S.STOPPED) in ALLOWED or (s, S.DRAINING) in ALLOWED or s in (S.STOPPED, S.DRAINING) for s in S)


def test_uptime_starts_at_ready_and_ends_when_leaving_it() -> None:
    clock = FakeClock()
    lc = lifecycle_at(S.STARTING, clock)
    lc.enter(S.READY)
    assert lc.started_at == 1000.0
    clock.now += 5
    lc.enter(S.CRASHED)
    assert lc.started_at is None


def test_backoff_doubles_until_capped() -> None:
    clock = FakeClock()
    budget = RestartBudget(policy=RestartPolicy(max_restarts=10, period_s=1000, backoff_initial_s=0.5, backoff_max_s=3), clock=clock)
    delays = []
    for _ in range(6):
        delays.append(budget.death())
        clock.now += 1
    assert delays == [0.5, 1.0, 2.0, 3, 3, 3]


def test_too_many_deaths_within_period_fail() -> None:
    clock = FakeClock()
    budget = RestartBudget(policy=RestartPolicy(max_restarts=2, period_s=60), clock=clock)
    assert budget.death() is not None
    clock.now += 1
    assert budget.death() is not None
    assert budget.left() == 0
    clock.now += 1
    assert budget.death() is None


def test_deaths_outside_the_period_are_forgotten() -> None:
    clock = FakeClock()
    budget = RestartBudget(policy=RestartPolicy(max_restarts=1, period_s=60, backoff_initial_s=1), clock=clock)
    assert budget.death() == 1
    clock.now += 61
    # The first death left the window: this one is again the first, with the first delay.
    assert budget.death() == 1
    assert budget.left() == 0


def test_operator_restart_forgives() -> None:
    """After `forgive`, a spent budget is whole again and the next death gets the
    first delay (the driver's part: tests/test_lifecycle_model.py)."""
    clock = FakeClock()
    budget = RestartBudget(policy=RestartPolicy(max_restarts=1, backoff_initial_s=0.5), clock=clock)
    assert budget.death() == 0.5
    clock.now += 1
    assert budget.death() is None and budget.left() == 0
    budget.forgive()
    assert budget.left() == 1
    clock.now += 1
    assert budget.death() == 0.5


def test_exit_status_sentences() -> None:
    assert ExitStatus(signal=11).describe() == "was killed by SIGSEGV"
    assert ExitStatus(code=3, reason="bad handshake").describe() == "exited with code 3 (bad handshake)"
    assert ExitStatus(signal=9, reason="memory limit").to_json()["text"] == "was killed by SIGKILL (memory limit)"
