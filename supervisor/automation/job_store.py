"""The cron jobs and their run records on disk, in `<state>/cron/`:

  jobs.jsonl   {"op": "put", "job": {...}} or {"op": "remove", "id": ...}, one per
               change, appended and fsynced before the change is acknowledged, so a
               job created and acknowledged survives a `kill -9` and a power cut.
  runs.jsonl   one RunRecord per line, appended when a run is fired and again when it
               ends (the last line of a run id wins). Not fsynced: a `kill -9` keeps
               what the kernel has; a power cut may lose the last moments, and then
               at worst a run is done again after the restart.

Appends, not rewrites, so that a change costs one short write whatever the number of
jobs (10,000 armed jobs are a benchmark of this issue). Both files are compacted at
load: jobs.jsonl to the jobs there are, runs.jsonl to the last `runs_kept` runs of
each; runs.jsonl also while serving, in a worker thread, once it has grown by four
times that (at least 10,000 lines) since. A line torn by a crash (a partial last line) or otherwise unreadable is named
in the log and skipped: the rest loads.

Created by the gateway with the scheduler (supervisor/automation/scheduler.py), which
is its only user.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from loguru import logger

from clawsup.supervisor.automation.jobs import Job, RunRecord

COMPACT_FACTOR = 4
COMPACT_FLOOR = 10_000
"""Lines runs.jsonl may hold before it is compacted while serving (at least)."""


class JobStore:
    def __init__(self, root: Path, *, runs_kept: int) -> None:
        self.root = root
        self.jobs_path = root / "jobs.jsonl"
        self.runs_path = root / "runs.jsonl"
        self.runs_kept = runs_kept
        self._run_lines = 0
        self._kept_lines = 0
        """Lines the last compaction left: the next one is due when the file has grown
        by the bound since, not when it holds the bound (10,000 jobs keep more)."""
        self._held: list[str] | None = None
        """Run lines written while runs.jsonl is being compacted: appended after."""
        self._compaction: asyncio.Task[None] | None = None

    # -- at start (blocking: run in a thread) -------------------------------------

    def load(self, system: frozenset[str] = frozenset()) -> tuple[dict[str, Job], dict[str, deque[RunRecord]]]:
        """The jobs, and each job's last runs, oldest first (the `system` jobs' too:
        they come from the config, their runs from here). Compacts both files."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        jobs: dict[str, Job] = {}
        for n, rec in _lines(self.jobs_path):
            try:
                if rec["op"] == "put":
                    job = Job.from_json(rec["job"])
                    jobs[job.id] = job
                elif rec["op"] == "remove":
                    jobs.pop(str(rec["id"]), None)
                else:
                    raise ValueError(f"unknown op {rec['op']!r}")
            except (KeyError, TypeError, ValueError) as e:
                logger.warning("{}:{}: not a job record ({}); skipped", self.jobs_path, n, e)
        runs: dict[str, deque[RunRecord]] = {jid: deque(maxlen=self.runs_kept) for jid in (*jobs, *system)}
        by_id: dict[str, RunRecord] = {}
        for n, rec in _lines(self.runs_path):
            try:
                r = RunRecord.from_json(rec)
            except (KeyError, TypeError, ValueError) as e:
                logger.warning("{}:{}: not a run record ({}); skipped", self.runs_path, n, e)
                continue
            if r.job_id not in runs:
                continue  # a removed job's
            if (old := by_id.get(r.run_id)) is not None:
                # The run's end: the record in the deque takes its fields.
                old.__dict__.update(r.__dict__)
                continue
            q = runs[r.job_id]
            if len(q) == q.maxlen:
                by_id.pop(q[0].run_id, None)
            q.append(r)
            by_id[r.run_id] = r
        _rewrite(self.jobs_path, (json.dumps({"op": "put", "job": j.to_json()}) for j in jobs.values()), sync=True)
        kept = [r for q in runs.values() for r in q]
        _rewrite(self.runs_path, (json.dumps(r.to_json()) for r in kept), sync=False)
        self._run_lines = self._kept_lines = len(kept)
        return jobs, runs

    # -- changes (blocking: run in a thread; durable when they return) -------------

    def put(self, job: Job) -> None:
        _append(self.jobs_path, json.dumps({"op": "put", "job": job.to_json()}), sync=True)

    def remove(self, job_id: str) -> None:
        _append(self.jobs_path, json.dumps({"op": "remove", "id": job_id}), sync=True)

    # -- run records (on the loop: one short write each) -----------------------------

    def record(self, run: RunRecord, everything: Iterable[RunRecord]) -> None:
        """Append `run` as it is now. `everything`: every kept record, for a
        compaction if the file has grown past its bound (read in the thread)."""
        line = json.dumps(run.to_json())
        if self._held is not None:
            self._held.append(line)
            return
        try:
            _append(self.runs_path, line, sync=False)
        except OSError as e:
            # The record is the history, not the run: the run goes on without it.
            logger.error("{}: cannot record run {} of job {}: {}", self.runs_path, run.run_id, run.job_id, e)
            return
        self._run_lines += 1
        if self._run_lines > self._kept_lines + max(COMPACT_FLOOR, COMPACT_FACTOR * self.runs_kept) and self._compaction is None:
            self._held = []
            snapshot = list(everything)
            self._compaction = asyncio.get_running_loop().create_task(self._compact(snapshot), name="cron runs compaction")

    async def _compact(self, snapshot: list[RunRecord]) -> None:
        try:
            await asyncio.to_thread(_rewrite, self.runs_path, (json.dumps(r.to_json()) for r in snapshot), sync=False)
            self._run_lines = self._kept_lines = len(snapshot)
        except OSError as e:
            logger.error("{}: cannot compact: {}", self.runs_path, e)
        finally:
            held, self._held = self._held or [], None
            self._compaction = None
            for line in held:
                try:
                    _append(self.runs_path, line, sync=False)
                    self._run_lines += 1
                except OSError as e:
                    logger.error("{}: cannot record a run: {}", self.runs_path, e)

    async def aclose(self) -> None:
        if self._compaction is not None:
            await asyncio.shield(self._compaction)


def _lines(path: Path) -> Iterable[tuple[int, dict[str, Any]]]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            logger.warning("{}:{}: a torn or unreadable line (a crash mid-write?); skipped", path, n)
            continue
        if isinstance(rec, dict):
            yield n, rec
        else:
            logger.warning("{}:{}: not a JSON object; skipped", path, n)


def _append(path: Path, line: str, *, sync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _rewrite(path: Path, lines: Iterable[str], *, sync: bool) -> None:
    """Atomically: a reader (or a crash) sees the old file or the new, never half."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", closefd=False) as f:
            for line in lines:
                f.write(line + "\n")
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if sync:
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
