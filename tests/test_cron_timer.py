"""The scheduler's timer logic on a virtual clock (supervisor/automation/scheduler.py):
what fires when, re-arming on changes, overlap, misfire after downtime, the slot
limit, and that idle jobs cost no wake-ups. The runs here are a recording stand-in
for the agent turn (tests/test_cron.py runs real ones in a real gateway); the job
store is the real one, on disk."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from clawsup.supervisor.automation.job_store import JobStore
from clawsup.supervisor.automation.jobs import Job, JobSpec, RunRecord
from clawsup.supervisor.automation.schedule import make_schedule
from clawsup.supervisor.automation.scheduler import CronError, Scheduler, Targets

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
BOUND_S = 5.0


class VirtualClock:
    """Time moves only when the test says; `sleep_until` returns when it has moved
    far enough, or when the scheduler is woken."""

    def __init__(self, t: float) -> None:
        self.t = t
        self._moved = asyncio.Event()
        self.asleep = asyncio.Event()
        self.asleep_until: float | None = None

    def time(self) -> float:
        return self.t

    async def sleep_until(self, when: float | None, wake: asyncio.Event) -> None:
        self.asleep_until = when
        while not wake.is_set() and (when is None or self.t < when):
            self._moved = asyncio.Event()
            self.asleep.set()
            waits = {asyncio.ensure_future(wake.wait()), asyncio.ensure_future(self._moved.wait())}
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
        self.asleep.clear()

    async def advance(self, to: float) -> None:
        """Move to `to` and return once the timer has fired what was due and sleeps again."""
        self.asleep.clear()
        self.t = to
        self._moved.set()
        await asyncio.wait_for(self.asleep.wait(), BOUND_S)


class Recorder:
    """Each run: recorded at its start (virtual time); it ends when its gate opens
    (open by default)."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.started: list[tuple[str, float, float, str]] = []
        self.gates: dict[str, asyncio.Event] = {}
        self.going = 0
        self.most = 0

    async def run(self, job: Job, record: RunRecord) -> None:
        self.started.append((job.id, record.due, self.clock.t, record.trigger))
        self.going += 1
        self.most = max(self.most, self.going)
        try:
            gate = self.gates.get(job.id)
            if gate is not None:
                await gate.wait()
            record.status = "ok"
        finally:
            self.going -= 1


async def up(tmp_path: Path, clock: VirtualClock, *, max_concurrent: int = 10, system: list[Job] | None = None) -> tuple[Scheduler, Recorder, asyncio.Event, asyncio.Task[None]]:
    rec = Recorder(clock)
    s = Scheduler(JobStore(tmp_path, runs_kept=50), rec, Targets(agents=frozenset({"main"}), channels=lambda: {"cli"}), max_concurrent=max_concurrent, max_jobs=20_000, system_jobs=system, clock=clock)
    stop = asyncio.Event()
    task = asyncio.create_task(s.run(stop))
    await asyncio.wait_for(s.loaded.wait(), BOUND_S)
    await asyncio.wait_for(clock.asleep.wait(), BOUND_S)
    return s, rec, stop, task


async def down(stop: asyncio.Event, task: asyncio.Task[None]) -> None:
    stop.set()
    await asyncio.wait_for(task, BOUND_S)


def spec(name: str, **kw: Any) -> JobSpec:
    return JobSpec(name=name, message=f"do {name}", **kw)


async def ended(s: Scheduler, job_id: str, n: int) -> list[RunRecord]:
    return await s.wait_runs(job_id, n, BOUND_S)


async def test_jobs_fire_at_their_times_in_order_and_only_then(tmp_path: Path) -> None:
    clock = VirtualClock(T0)
    s, rec, stop, task = await up(tmp_path, clock)
    a = await s.add(spec("a", every="10m"), agent=None, owner=True, created_by="test")
    b = await s.add(spec("b", cron="30 8 * * *"), agent=None, owner=True, created_by="test")
    c = await s.add(spec("c", at="2027-01-15T08:25:00Z"), agent=None, owner=True, created_by="test")
    await asyncio.wait_for(clock.asleep.wait(), BOUND_S)
    assert clock.asleep_until == T0 + 600  # the first due: a's
    woke = s.wakeups
    for minute in (10, 20, 25, 30):
        await clock.advance(T0 + minute * 60)
    await ended(s, a.id, 3)
    fired = [(jid, due - T0) for jid, due, _, _ in rec.started]
    assert fired == [(a.id, 600), (a.id, 1200), (c.id, 1500), (a.id, 1800), (b.id, 1800)] or fired == [(a.id, 600), (a.id, 1200), (c.id, 1500), (b.id, 1800), (a.id, 1800)]
    # One wake-up per move of the clock: nothing polls in between.
    assert s.wakeups - woke == 4
    # The one-off job ran and is now disabled, durably.
    assert not s.jobs[c.id].enabled
    await down(stop, task)
    puts = [json.loads(line) for line in (tmp_path / "jobs.jsonl").read_text().splitlines()]
    assert [p["job"]["enabled"] for p in puts if p["op"] == "put" and p["job"]["id"] == c.id][-1] is False


async def test_a_change_rearms_the_timer_at_once(tmp_path: Path) -> None:
    clock = VirtualClock(T0)
    s, rec, stop, task = await up(tmp_path, clock)
    late = await s.add(spec("late", every="1h"), agent=None, owner=True, created_by="test")
    await asyncio.wait_for(clock.asleep.wait(), BOUND_S)
    assert clock.asleep_until == T0 + 3600
    clock.asleep.clear()
    soon = await s.add(spec("soon", every="1m"), agent=None, owner=True, created_by="test")
    await asyncio.wait_for(clock.asleep.wait(), BOUND_S)
    assert clock.asleep_until == T0 + 60, "an earlier job woke the timer and armed it"
    clock.asleep.clear()
    await s.set_enabled(soon.id, False)
    await s.remove(late.id)
    await clock.advance(T0 + 7200)
    assert rec.started == [], "a disabled job and a removed one never fire"
    await down(stop, task)


async def test_overlap_skip_records_the_skipped_run_and_queue_keeps_one(tmp_path: Path) -> None:
    clock = VirtualClock(T0)
    s, rec, stop, task = await up(tmp_path, clock)
    skip = await s.add(spec("skip", every="1m"), agent=None, owner=True, created_by="test")
    queue = await s.add(spec("queue", every="1m", overlap="queue"), agent=None, owner=True, created_by="test")
    rec.gates[skip.id], rec.gates[queue.id] = asyncio.Event(), asyncio.Event()
    for minute in (1, 2, 3, 4):
        await clock.advance(T0 + minute * 60)
    # Three times due while its run goes on: one record, one log line, counted.
    (skipped,) = await ended(s, skip.id, 1)
    assert skipped.status == "skipped" and skipped.due == T0 + 120 and skipped.times == 3
    assert re.fullmatch(r"run [0-9a-f]{12} was still going \(overlap: skip\)", skipped.reason), skipped.reason
    (extra,) = await ended(s, queue.id, 1)
    assert extra.status == "skipped" and "one run is already queued" in extra.reason and extra.times == 2
    rec.gates[queue.id].set()
    done = await ended(s, queue.id, 3)
    assert [r.trigger for r in done if r.status == "ok"] == ["schedule", "queued"]
    assert [due - T0 for jid, due, _, _ in rec.started if jid == queue.id] == [60, 120]
    rec.gates[skip.id].set()
    await ended(s, skip.id, 2)
    assert skipped.reason.endswith("; 3 due times in all")
    await down(stop, task)
    lines = [json.loads(x) for x in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [x["times"] for x in lines if x["runId"] == skipped.run_id] == [1, 3], "written when it began and once more at the end"


async def test_misfire_after_downtime_runs_once_or_is_skipped_and_never_bursts(tmp_path: Path) -> None:
    clock = VirtualClock(T0)
    s, rec, stop, task = await up(tmp_path, clock)
    once = await s.add(spec("once", every="10m"), agent=None, owner=True, created_by="test")
    skip = await s.add(spec("skip", every="10m", misfire="skip"), agent=None, owner=True, created_by="test")
    await clock.advance(T0 + 600)
    await ended(s, once.id, 1)
    await ended(s, skip.id, 1)
    await down(stop, task)
    # Down for two hours: twelve times missed each.
    clock.t = T0 + 600 + 2 * 3600 + 30
    s, rec, stop, task = await up(tmp_path, clock)
    runs = await ended(s, once.id, 2)
    assert runs[-1].trigger == "misfire" and runs[-1].due == T0 + 1200, runs[-1]
    skipped = await ended(s, skip.id, 2)
    assert skipped[-1].status == "skipped" and "missed while the gateway was down" in skipped[-1].reason
    assert [t for _, _, _, t in rec.started] == ["misfire"], "one run for all it missed, and none for the skip job"
    # Re-armed from now, on its grid: the next is the next ten-minute mark.
    assert s.jobs_json()[0]["nextRunAt"] == T0 + 600 + 2 * 3600 + 600
    await down(stop, task)


async def test_a_run_the_last_supervisor_left_running_is_recorded_as_lost(tmp_path: Path) -> None:
    clock = VirtualClock(T0)
    s, rec, stop, task = await up(tmp_path, clock)
    job = await s.add(spec("slow", every="10m"), agent=None, owner=True, created_by="test")
    rec.gates[job.id] = asyncio.Event()
    await clock.advance(T0 + 600)
    # The supervisor dies mid-run: its record says `running`, as a kill -9 leaves it.
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    lines = (tmp_path / "runs.jsonl").read_text().splitlines()
    (tmp_path / "runs.jsonl").write_text("\n".join(line for line in lines if json.loads(line)["status"] == "running") + "\n" + '{"jobId": "torn')
    s, rec, stop, task = await up(tmp_path, clock)
    (lost,) = s.runs(job.id, 10)
    assert lost.status == "failed" and "the supervisor stopped during the run" in lost.reason
    await down(stop, task)


async def test_runs_past_the_slot_limit_wait_for_a_slot(tmp_path: Path) -> None:
    clock = VirtualClock(T0)
    s, rec, stop, task = await up(tmp_path, clock, max_concurrent=2)
    jobs = [await s.add(spec(f"j{i}", every="1m"), agent=None, owner=True, created_by="test") for i in range(5)]
    gate = asyncio.Event()
    for j in jobs:
        rec.gates[j.id] = gate
    await clock.advance(T0 + 60)
    await asyncio.sleep(0)  # the runs' tasks take their slots
    assert rec.going == 2
    gate.set()
    for j in jobs:
        await ended(s, j.id, 1)
    assert rec.most == 2
    await down(stop, task)


async def test_ten_thousand_idle_jobs_cost_no_wakeups(tmp_path: Path) -> None:
    clock = VirtualClock(T0)
    # Written as the store writes them (one fsync for all, not 10,000).
    jobs = (Job(id=f"j{i:05d}", name=f"j{i}", agent="main", schedule=make_schedule(every="1h", now=T0 + i), message="x", created_at=T0 + i) for i in range(10_000))
    (tmp_path / "jobs.jsonl").write_text("".join(json.dumps({"op": "put", "job": j.to_json()}) + "\n" for j in jobs))
    s, rec, stop, task = await up(tmp_path, clock)
    assert len(s.jobs) == 10_000
    assert clock.asleep_until == T0 + 3600
    woke = s.wakeups
    await clock.advance(T0 + 3599)
    assert s.wakeups == woke and rec.started == [], "the timer slept through an hour of 10,000 jobs"
    await clock.advance(T0 + 3600)
    assert s.wakeups == woke + 1 and [jid for jid, *_ in rec.started] == ["j00000"]
    await down(stop, task)


async def test_a_storm_of_overlapping_every_second_jobs_neither_holds_the_loop_nor_floods_the_records(tmp_path: Path) -> None:
    """2,000 jobs every second whose runs never end (an attack measured 61 % of a core
    and 18 s answers from the control socket with 2,100 of them): each pass over them
    yields to the loop, and each job's overlap is one record, not one a second."""
    clock = VirtualClock(T0)
    s, rec, stop, task = await up(tmp_path, clock, max_concurrent=10)
    gate = asyncio.Event()
    n = 2000
    jobs = [await s.add(spec(f"s{i}", every="1s"), agent=None, owner=True, created_by="test") for i in range(n)]
    for j in jobs:
        rec.gates[j.id] = gate
    turns = 0

    def probe() -> None:
        nonlocal turns
        turns += 1
        if not gate.is_set():
            asyncio.get_running_loop().call_soon(probe)

    probe()
    before = turns
    await clock.advance(T0 + 1)
    assert turns - before >= n // 64, f"the loop turned {turns - before} times while {n} runs were fired"
    for second in (2, 3, 4, 5):
        await clock.advance(T0 + second)
    records = (tmp_path / "runs.jsonl").read_text().splitlines()
    assert len(records) <= 2 * n, f"{len(records)} run records for {n} jobs over 5 s"
    assert all(r.times == 4 for j in jobs for r in s.runs(j.id, 5) if r.status == "skipped")
    gate.set()
    await down(stop, task)


async def test_a_removed_job_leaves_no_run_records_behind(tmp_path: Path) -> None:
    clock = VirtualClock(T0)
    s, rec, stop, task = await up(tmp_path, clock)
    for i in range(50):
        job = await s.add(spec(f"j{i}", every="1h"), agent="main", owner=True, created_by="agent main", session="agent:main:main")
        s.run_now(job.id, agent="main")
        await ended(s, job.id, 1)
        await s.remove(job.id, agent="main")
    assert s._runs.keys() <= s.jobs.keys()
    await down(stop, task)


async def test_what_an_agent_may_add_is_held_to_its_share_its_session_and_a_minute(tmp_path: Path) -> None:
    clock = VirtualClock(T0)
    rec = Recorder(clock)
    s = Scheduler(
        JobStore(tmp_path, runs_kept=5), rec, Targets(agents=frozenset({"main", "other"}), channels=lambda: {"cli"}),
        max_concurrent=2, max_jobs=100, max_jobs_per_agent=2, clock=clock,
    )  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(s.run(stop))
    await asyncio.wait_for(s.loaded.wait(), BOUND_S)
    mine = dict(agent="main", owner=True, created_by="agent main (session agent:main:main)", session="agent:main:main")
    with pytest.raises(CronError, match=r"^every: at least 60 s for a job an agent adds"):
        await s.add(spec("fast", every="1s"), **mine)  # type: ignore[arg-type]
    with pytest.raises(CronError, match=r"^session: a job you add may run in this session \(agent:main:main\)"):
        await s.add(spec("theirs", every="1h", session="agent:main:direct:victim"), **mine)  # type: ignore[arg-type]
    bound = await s.add(spec("bound", every="1h", session="AGENT:Main:MAIN"), **mine)  # type: ignore[arg-type]
    assert bound.session == "agent:main:main"
    await s.add(spec("second", every="1h"), **mine)  # type: ignore[arg-type]
    with pytest.raises(CronError, match=r"agent main already has 2 jobs it added \(automation.cron.maxJobsPerAgent\)"):
        await s.add(spec("third", every="1h"), **mine)  # type: ignore[arg-type]
    # The operator's jobs are not the agent's share, and may be shorter.
    await s.add(spec("operator's", every="1s", agent="main"), agent=None, owner=True, created_by="operator")
    await down(stop, task)


# -- from the review (each failed before its fix) ----------------------------------------


async def test_a_disabled_job_does_not_run_what_it_had_queued(tmp_path: Path) -> None:
    clock = VirtualClock(T0)
    s, rec, stop, task = await up(tmp_path, clock)
    q = await s.add(spec("q", every="1m", overlap="queue"), agent=None, owner=True, created_by="test")
    rec.gates[q.id] = asyncio.Event()
    await clock.advance(T0 + 60)
    await clock.advance(T0 + 120)  # due while the first goes on: queued
    await s.set_enabled(q.id, False)
    rec.gates[q.id].set()
    (done,) = await ended(s, q.id, 1)
    assert done.status == "ok" and [t for _, _, _, t in rec.started] == ["schedule"]
    await down(stop, task)


async def test_time_spent_disabled_or_covered_by_a_misfire_run_is_not_a_misfire_at_the_next_start(tmp_path: Path) -> None:
    clock = VirtualClock(T0)
    s, rec, stop, task = await up(tmp_path, clock)
    paused = await s.add(spec("paused", every="1h"), agent=None, owner=True, created_by="test")
    down_long = await s.add(spec("down", every="10m"), agent=None, owner=True, created_by="test")
    await clock.advance(T0 + 3600)
    await ended(s, paused.id, 1)
    await s.set_enabled(paused.id, False)
    await s.set_enabled(down_long.id, False)
    await clock.advance(T0 + 5 * 3600)
    await s.set_enabled(paused.id, True)  # five hours disabled: not missed
    await s.set_enabled(down_long.id, True)
    await down(stop, task)
    clock.t = T0 + 8 * 3600 + 30  # down for three hours: both missed times since re-enabling
    s, rec, stop, task = await up(tmp_path, clock)
    await ended(s, paused.id, 2)
    await ended(s, down_long.id, 1)
    await down(stop, task)
    assert sorted(t for _, _, _, t in rec.started) == ["misfire", "misfire"]
    clock.t += 10  # and restarted again at once: what that misfire run covered is not missed again
    s, rec, stop, task = await up(tmp_path, clock)
    await down(stop, task)
    assert rec.started == [], rec.started


async def test_concurrent_changes_of_one_job_do_not_bring_it_back(tmp_path: Path) -> None:
    clock = VirtualClock(T0)
    s, rec, stop, task = await up(tmp_path, clock)
    j = await s.add(spec("j", every="1m"), agent=None, owner=True, created_by="test")
    said = await asyncio.gather(s.remove(j.id), s.set_enabled(j.id, False), s.remove(j.id), return_exceptions=True)
    assert said[0] is not None and all(isinstance(x, CronError) for x in said[1:]), said
    assert j.id not in s.jobs
    await down(stop, task)
    s, rec, stop, task = await up(tmp_path, clock)
    assert j.id not in s.jobs, "the store brought it back"
    await down(stop, task)


async def test_runs_are_compacted_once_per_growth_not_on_every_record(tmp_path: Path) -> None:
    """10,000 jobs keep more records than the compaction floor: compaction must be
    due when the file has grown by the bound since the last one, not at every record."""
    store = JobStore(tmp_path, runs_kept=100)
    store.load()
    kept = [RunRecord(job_id=f"j{i % 5000}", run_id=f"r{i}", due=0.0, trigger="schedule", fired_at=0.0, status="ok") for i in range(10_300)]
    compactions = 0
    for r in kept:
        store.record(r, kept)
        if store._compaction is not None:
            compactions += 1
            await store._compaction
    assert compactions == 1
    for i in range(200):
        store.record(RunRecord(job_id="j1", run_id=f"x{i}", due=0.0, trigger="schedule", fired_at=0.0, status="ok"), kept)
        assert store._compaction is None, f"compacted again after {i + 1} more records"
