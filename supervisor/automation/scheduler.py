"""The cron scheduler: the jobs, one timer for the next due one, and the runs.

Event-driven: a heap of (due time, job) and one task that sleeps until the first
entry is due or a change wakes it (a job added, enabled or removed re-arms at once).
Nothing polls: 10,000 idle jobs cost one sleeping task (the timer re-reads the wall
clock at least every `MAX_SLEEP_S`, so that a clock set forward or back is noticed;
schedules are wall-clock times).

When a job is due, its run is fired:
- while its last run goes on, the new one is skipped (`overlap: skip`, recorded with
  the reason) or queued (`overlap: queue`, one at most, run when the last ends);
- at most `automation.cron.maxConcurrentRuns` runs go at once; a run past it waits
  for a slot (its record says when it was due and when it started);
- then the job is armed for its next time after now: a gateway that was late does not
  fire a burst of the times it missed.

At start every enabled job is re-armed from its last run (or its creation): a time it
missed while the gateway was down is run once (`misfire: run_once`) or recorded as
skipped (`misfire: skip`), and a run the last supervisor left `running` is recorded
as lost. The heartbeat (heartbeat.py) is a system job here like any other: in
`cron list`, under the same overlap and timeout rules.

Created by the gateway; `run()` owns the timer and every run's task, and cancels them
when the gateway stops. The operator's CLI (through the control API) and the agent's
`cron` tool (cron_tool.py) change jobs through the methods below.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from loguru import logger

from clawsup.supervisor.automation.job_store import JobStore
from clawsup.supervisor.automation.jobs import Job, JobSpec, RunRecord, Trigger
from clawsup.supervisor.automation.schedule import ScheduleError
from clawsup.supervisor.errors import ClawsupError

MAX_SLEEP_S = 3600.0
YIELD_EVERY = 64
"""Runs fired between two yields to the loop: a pass over thousands of due jobs must
not hold it (the control socket, the channels and every turn wait meanwhile)."""
AGENT_MIN_EVERY_S = 60.0
"""The shortest `every` of a job an agent adds; the operator's may be shorter."""


class CronError(ClawsupError):
    code = "cron"


class Clock(Protocol):
    """Wall-clock time, and a wait until a time of it or a wake-up (tests use a
    virtual one: tests/test_cron_timer.py)."""

    def time(self) -> float: ...

    async def sleep_until(self, when: float | None, wake: asyncio.Event) -> None:
        """Return at `when` (None: never), or as soon as `wake` is set."""
        ...


class WallClock:
    def time(self) -> float:
        return time.time()

    async def sleep_until(self, when: float | None, wake: asyncio.Event) -> None:
        delay = MAX_SLEEP_S if when is None else min(MAX_SLEEP_S, when - self.time())
        if delay <= 0:
            await asyncio.sleep(0)  # due already: still, let the loop breathe
            return
        try:
            async with asyncio.timeout(delay):
                await wake.wait()
        except TimeoutError:
            pass


class Runner(Protocol):
    """What does a run (cron_run.py): fills in `record` (started, status, reply,
    delivery); returns when the run has ended. Raises only CancelledError."""

    async def run(self, job: Job, record: RunRecord) -> None: ...


@dataclass(frozen=True)
class Targets:
    """What a job may name, checked when it is added: the gateway's agents, and the
    channels that run (asked each time: plugin channels come and go)."""

    agents: frozenset[str]
    channels: Callable[[], set[str]]


class Scheduler:
    def __init__(
        self,
        store: JobStore,
        runner: Runner,
        targets: Targets,
        *,
        max_concurrent: int,
        max_jobs: int,
        max_jobs_per_agent: int = 50,
        system_jobs: list[Job] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._store = store
        self._runner = runner
        self._targets = targets
        self._clock: Clock = clock or WallClock()
        self._slots = asyncio.Semaphore(max_concurrent)
        self._max_jobs = max_jobs
        self._max_per_agent = max_jobs_per_agent
        self._system = {j.id: j for j in system_jobs or ()}
        self.jobs: dict[str, Job] = {}
        self._runs: dict[str, deque[RunRecord]] = {}
        self._heap: list[tuple[float, int, str]] = []
        self._next: dict[str, float] = {}
        """Job id -> its armed due time; a heap entry that does not match is stale."""
        self._seq = itertools.count()
        self._running: dict[str, RunRecord] = {}
        self._queued: dict[str, tuple[float, Trigger]] = {}
        self._skipping: dict[str, RunRecord] = {}
        """Job id -> the record of the times skipped while its current run goes on."""
        self._wake = asyncio.Event()
        self._ended = asyncio.Event()
        """Set (and replaced) each time a run ends: `wait_runs` waits on it."""
        self._tg: asyncio.TaskGroup | None = None
        self._run_tasks: set[asyncio.Task[None]] = set()
        self._changing = asyncio.Lock()
        """Held by each change of a job (add, remove, enable, disable, the store write
        of an `at` job done), across its store write: two changes of one job never
        interleave, in memory or on disk."""
        self.loaded = asyncio.Event()
        self.wakeups = 0
        """Times the timer woke (for tests: no polling)."""

    # -- the owner of the timer and the runs ---------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        # Reading the files and working out each job's next time (some 25 µs each,
        # a quarter of a second for 10,000 jobs) happen in a thread, off the loop.
        due = await asyncio.to_thread(self._load)
        timer: asyncio.Task[None] | None = None
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                try:
                    self._recover(due)
                    self.loaded.set()
                    timer = tg.create_task(self._timer(), name="cron timer")
                    await stop.wait()
                finally:
                    # Stopped, or cancelled with the gateway's group: either way no
                    # run starts from here on (a queued one at a run's end included).
                    self._tg = None
                    for t in (*self._run_tasks, *([timer] if timer is not None else [])):
                        t.cancel()
        finally:
            await self._store.aclose()

    def _load(self) -> dict[str, float | None]:
        """The store's jobs and runs, and each enabled job's next time after its last
        run (or its creation): due already if it was missed. Blocking."""
        jobs, runs = self._store.load(frozenset(self._system))
        self.jobs = {**jobs, **self._system}
        self._runs = runs
        due: dict[str, float | None] = {}
        for job in self.jobs.values():
            self._runs.setdefault(job.id, deque(maxlen=self._store.runs_kept))
            if job.enabled:
                # What the last record covers: a run's due time, or for a misfire
                # record the time it was made (it stood for everything missed until
                # then); and nothing before the job was last enabled.
                covered = (r.fired_at if r.trigger == "misfire" else r.due for r in self._runs[job.id] if r.trigger != "manual")
                ref = max(max(covered, default=job.created_at), job.enabled_at)
                due[job.id] = job.schedule.next_after(ref)
        return due

    def _recover(self, next_due: dict[str, float | None]) -> None:
        now = self._clock.time()
        for job in self.jobs.values():
            for r in self._runs[job.id]:
                if r.status == "running":
                    r.status, r.ended_at = "failed", now
                    r.reason = "the supervisor stopped during the run (killed or crashed); the run was lost with it"
                    self._keep(r)
            if job.id not in next_due:
                continue
            due = next_due[job.id]
            if due is not None and due <= now and not job.system:
                if job.misfire == "run_once":
                    logger.info("cron job {} ({}) was due at {} while the gateway was down: running it once now", job.id, job.name, _iso(due))
                    self._fire(job, due, "misfire")
                else:
                    rec = self._new_record(job, due, "misfire")
                    self._end(rec, "skipped", f"missed while the gateway was down (since {_iso(due)}); misfire: skip")
                self._arm(job, after=now)
            elif due is not None and due <= now:
                self._arm(job, after=now)
            else:
                self._arm_at(job, due)

    async def _timer(self) -> None:
        fired = 0
        while True:
            now = self._clock.time()
            while self._heap and self._heap[0][0] <= now:
                fired += 1
                if fired % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
                    continue  # the heap may have changed meanwhile
                due, _, jid = heapq.heappop(self._heap)
                if self._next.get(jid) != due:
                    continue  # re-armed or removed since
                del self._next[jid]
                job = self.jobs.get(jid)
                if job is None or not job.enabled:
                    continue
                self._fire(job, due, "schedule")
                self._arm(job, after=max(due, now))
            # Cleared here, with no await before the heap is read: what this pass
            # armed is in the heap already, and a change made while we sleep wakes us.
            self._wake.clear()
            await self._clock.sleep_until(self._heap[0][0] if self._heap else None, self._wake)
            self.wakeups += 1

    # -- arming and firing ----------------------------------------------------------

    def _arm(self, job: Job, *, after: float) -> None:
        self._arm_at(job, job.schedule.next_after(after))

    def _arm_at(self, job: Job, due: float | None) -> None:
        if due is None:
            self._next.pop(job.id, None)
            if job.schedule.kind == "at" and job.enabled and not job.system:
                # Done: kept (its runs stay listed), disabled, durably.
                self.jobs[job.id] = done = job.with_enabled(False, self._clock.time())
                self._persist(done)
            return
        self._next[job.id] = due
        heapq.heappush(self._heap, (due, next(self._seq), job.id))
        if self._heap[0][2] == job.id:
            self._wake.set()

    def _new_record(self, job: Job, due: float, trigger: Trigger) -> RunRecord:
        return RunRecord(job_id=job.id, run_id=uuid.uuid4().hex[:12], due=due, trigger=trigger, fired_at=self._clock.time())

    def _fire(self, job: Job, due: float, trigger: Trigger) -> RunRecord:
        running = self._running.get(job.id)
        if running is not None:
            if job.overlap == "queue" and job.id not in self._queued:
                self._queued[job.id] = (due, trigger)
                logger.info("cron job {} ({}): due while run {} goes on; queued", job.id, job.name, running.run_id)
                rec = self._new_record(job, due, trigger)
                rec.status, rec.reason = "running", f"queued behind run {running.run_id}"
                return rec
            skipping = self._skipping.get(job.id)
            if skipping is not None:
                # One record (and one log line) per run overrun, however many times
                # were due meanwhile; it is written again, with the count, at the end.
                skipping.times += 1
                return skipping
            rec = self._new_record(job, due, trigger)
            why = f"run {running.run_id} was still going" + (", and one run is already queued" if job.overlap == "queue" else "") + f" (overlap: {job.overlap})"
            self._skipping[job.id] = rec
            self._end(rec, "skipped", why)
            return rec
        if self._tg is None:
            raise CronError("the gateway is shutting down")
        rec = self._new_record(job, due, trigger)
        self._running[job.id] = rec
        self._keep(rec)
        task = self._tg.create_task(self._drive(job, rec), name=f"cron run {job.id} {rec.run_id}")
        self._run_tasks.add(task)
        task.add_done_callback(self._run_tasks.discard)
        return rec

    async def _drive(self, job: Job, rec: RunRecord) -> None:
        try:
            async with self._slots:
                await self._runner.run(job, rec)
        except asyncio.CancelledError:
            if rec.status == "running":
                rec.status, rec.reason = "failed", "the gateway stopped during the run"
            raise
        except Exception as e:
            logger.exception("cron run {} of job {} failed in the supervisor", rec.run_id, job.id)
            rec.status, rec.reason = "failed", f"supervisor error: {type(e).__name__}: {e}"
        finally:
            if rec.status == "running":
                rec.status, rec.reason = "failed", rec.reason or "the run ended without an outcome"
            self._end(rec, rec.status, rec.reason)
            if self._running.get(job.id) is rec:
                del self._running[job.id]
            skipped = self._skipping.pop(job.id, None)
            if skipped is not None and skipped.times > 1:
                skipped.reason += f"; {skipped.times} due times in all"
                self._keep(skipped)
            queued = self._queued.pop(job.id, None)
            now_job = self.jobs.get(job.id)
            if queued is not None and self._tg is not None and now_job is not None and (now_job.enabled or queued[1] == "manual"):
                self._fire(now_job, queued[0], "queued")

    def _end(self, rec: RunRecord, status: Any, reason: str) -> None:
        rec.status, rec.reason = status, reason
        rec.ended_at = rec.ended_at or self._clock.time()
        self._keep(rec)
        level = "INFO" if status in ("ok", "skipped") else "WARNING"
        logger.log(level, "cron run {} of job {}: {}{}", rec.run_id, rec.job_id, status, f": {reason}" if reason else "")
        self._ended.set()
        self._ended = asyncio.Event()

    def _keep(self, rec: RunRecord) -> None:
        if rec.job_id not in self.jobs:
            return  # removed meanwhile: its records went with it
        q = self._runs.setdefault(rec.job_id, deque(maxlen=self._store.runs_kept))
        if not any(r is rec for r in q):
            q.append(rec)
        self._store.record(rec, (r for runs in self._runs.values() for r in runs))

    def _persist(self, job: Job) -> None:
        if self._tg is not None:
            self._tg.create_task(self._put(job), name=f"cron store {job.id}")

    async def _put(self, job: Job) -> None:
        """A change the scheduler made itself (an `at` job done). A disk that fails
        costs the change on disk, said in the log, never the scheduler."""
        async with self._changing:
            if self.jobs.get(job.id) is not job:
                return  # changed or removed meanwhile: that change is the one kept
            try:
                await asyncio.to_thread(self._store.put, job)
            except OSError as e:
                logger.error("cron job {} ({}): cannot record that it is done: {}", job.id, job.name, e)

    # -- what the CLI and the cron tool do -------------------------------------------

    def jobs_json(self, agent: str | None = None) -> list[dict[str, Any]]:
        out = []
        for job in self.jobs.values():
            if agent is not None and job.agent != agent:
                continue
            last = self._runs.get(job.id)
            out.append(
                {
                    **job.to_json(),
                    "schedule": job.schedule.to_json(),
                    "describe": job.schedule.describe(),
                    "nextRunAt": self._next.get(job.id),
                    "running": job.id in self._running,
                    "last": last[-1].to_json() if last else None,
                }
            )
        return out

    async def add(self, spec: JobSpec, *, agent: str | None, owner: bool, created_by: str, session: str | None = None) -> Job:
        """`agent` and `session`: the agent's turn that adds it (the cron tool), held
        to its own agent's jobs, to its own session as a binding, to
        `maxJobsPerAgent` and to `AGENT_MIN_EVERY_S`; None for the operator."""
        target = (agent or spec.agent or "").strip().lower() or "main"
        if spec.session is not None:
            spec = spec.model_copy(update={"session": spec.session.strip().lower()})
        if agent is not None:
            if spec.session is not None and spec.session != (session or "").lower():
                raise CronError(f"session: a job you add may run in this session ({session}) or in one of its own, not in {spec.session!r}")
            mine = sum(j.agent == agent and j.created_by.startswith("agent ") for j in self.jobs.values())
            if mine >= self._max_per_agent:
                raise CronError(f"agent {agent} already has {mine} jobs it added (automation.cron.maxJobsPerAgent); remove one first")
        if spec.agent is not None and agent is not None and spec.agent.strip().lower() != agent:
            raise CronError(f"agent: a job you add is your own agent's ({agent}), not {spec.agent!r}")
        if target not in self._targets.agents:
            raise CronError(f"agent: unknown agent {target!r} (agents: {', '.join(sorted(self._targets.agents))})")
        if (spec.channel is None) != (spec.peer is None):
            raise CronError("channel and peer: give both (where the reply goes), or neither (a silent job)")
        if spec.channel is not None and spec.channel not in (live := self._targets.channels()):
            raise CronError(f"channel: unknown channel {spec.channel!r} (running: {', '.join(sorted(live)) or 'none'})")
        if spec.session is not None and not spec.session.lower().startswith(f"agent:{target}:"):
            raise CronError(f"session: {spec.session!r} is not one of agent {target}'s sessions (agent:{target}:...)")
        if sum(not j.system for j in self.jobs.values()) >= self._max_jobs:
            raise CronError(f"there are already {self._max_jobs} jobs (automation.cron.maxJobs); remove one first")
        try:
            job = Job.from_spec(spec, agent=target, now=self._clock.time(), owner=owner, created_by=created_by)
        except ScheduleError as e:
            raise CronError(str(e)) from None
        if agent is not None and job.schedule.every_s is not None and job.schedule.every_s < AGENT_MIN_EVERY_S:
            raise CronError(f"every: at least {AGENT_MIN_EVERY_S:g} s for a job an agent adds (the operator's may be shorter)")
        async with self._changing:
            await asyncio.to_thread(self._store.put, job)  # durable before it is acknowledged
        self.jobs[job.id] = job
        self._runs[job.id] = deque(maxlen=self._store.runs_kept)
        if job.enabled:
            self._arm(job, after=job.created_at)
        logger.info("cron job {} ({}) added by {}: {}", job.id, job.name, created_by, job.schedule.describe())
        return job

    def _own(self, job_id: str, agent: str | None) -> Job:
        job = self.jobs.get(job_id)
        if job is None or (agent is not None and job.agent != agent):
            mine = [j.id for j in self.jobs.values() if agent is None or j.agent == agent]
            raise CronError(f"no cron job {job_id!r}{f' of agent {agent}' if agent else ''} (jobs: {', '.join(mine) or 'none'})")
        return job

    async def remove(self, job_id: str, *, agent: str | None = None) -> Job:
        async with self._changing:
            return await self._remove(job_id, agent)

    async def _remove(self, job_id: str, agent: str | None) -> Job:
        job = self._own(job_id, agent)
        if job.system:
            raise CronError(f"{job_id} is a system job, from the config (automation.heartbeat); change it there")
        await asyncio.to_thread(self._store.remove, job_id)
        del self.jobs[job_id]
        self._next.pop(job_id, None)
        self._queued.pop(job_id, None)
        self._skipping.pop(job_id, None)
        self._runs.pop(job_id, None)
        logger.info("cron job {} ({}) removed", job.id, job.name)
        return job

    async def set_enabled(self, job_id: str, enabled: bool, *, agent: str | None = None) -> Job:
        async with self._changing:
            return await self._set_enabled(job_id, enabled, agent)

    async def _set_enabled(self, job_id: str, enabled: bool, agent: str | None) -> Job:
        job = self._own(job_id, agent)
        if job.system:
            raise CronError(f"{job_id} is a system job, from the config (automation.heartbeat); change it there")
        changed = job.with_enabled(enabled, self._clock.time())
        await asyncio.to_thread(self._store.put, changed)
        self.jobs[job_id] = changed
        if enabled:
            # From now: what it would have run while disabled is not a misfire
            # (`enabled_at` says so after a restart too).
            self._arm(changed, after=changed.enabled_at)
        else:
            self._next.pop(job_id, None)
            self._queued.pop(job_id, None)
        return changed

    def run_now(self, job_id: str, *, agent: str | None = None) -> RunRecord:
        job = self._own(job_id, agent)
        return self._fire(job, self._clock.time(), "manual")

    def runs(self, job_id: str, n: int, *, agent: str | None = None) -> list[RunRecord]:
        self._own(job_id, agent)
        return list(self._runs.get(job_id, ()))[-n:]

    async def wait_runs(self, job_id: str, count: int, timeout: float) -> list[RunRecord]:
        """Until the job has `count` ended runs (skipped ones included)."""
        async with asyncio.timeout(timeout):
            while True:
                self._own(job_id, None)
                ended = [r for r in self._runs.get(job_id, ()) if r.status != "running"]
                if len(ended) >= count:
                    return ended
                await self._ended.wait()


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
