"""One subagent run, from its sandbox's start to its report: the run's task goes in
its session, a `subagent` sandbox starts with the run's services (run_services.py),
the run's loop runs in it (RunAgent), and however that ends (an answer, a failure,
its timeout, a crash, a kill), the run's children are taken down, its sandboxes are
discarded, and its parent hears of it once (run_reports.py).

So a runaway run is a child like any other: its timeout kills it, its crash fails
it, and the gateway goes on. Created by the gateway; `Subagents` runs `drive` as
each run's task.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

from loguru import logger

from clawsup.sandbox.launch.launcher import Backend
from clawsup.supervisor.agents.run_reports import RunReports
from clawsup.supervisor.agents.runs import Run
from clawsup.supervisor.config import ClawsupConfig
from clawsup.supervisor.errors import ClawsupError, SandboxDied
from clawsup.supervisor.hooks import HookObserver
from clawsup.supervisor.messages.session_store import SessionStore
from clawsup.supervisor.sandboxes.child_requests import Service
from clawsup.supervisor.sandboxes.lifecycle import SandboxState
from clawsup.supervisor.sandboxes.manager import Sandboxes
from clawsup.supervisor.sandboxes.plans import SandboxPlan, subagent_plan
from clawsup.supervisor.sandboxes.supervised import SupervisedSandbox
from clawsup.supervisor.tools.workspace_settings import WorkspaceSettings

STOP_TIMEOUT_S = 10.0


class RunDriver:
    def __init__(
        self,
        cfg: ClawsupConfig,
        *,
        sandboxes: Sandboxes,
        workspace: WorkspaceSettings,
        backends: Mapping[str, Backend],
        store: SessionStore,
        reports: RunReports,
        hooks: HookObserver | None = None,
    ) -> None:
        """`backends`: agent id -> the backend of its runs' sandboxes (`run_backends`);
        `hooks` hear `subagent_ended` and `session_end` (supervisor/hooks.py)."""
        self._hooks = hooks
        self._max_iterations = cfg.agent_loop.max_iterations
        self._start_timeout_s = cfg.agents.defaults.subagents.start_timeout_seconds
        self._sandboxes = sandboxes
        self._workspace = workspace
        self._backends = backends
        self._store = store
        self._reports = reports

    def _plan(self, run: Run) -> SandboxPlan:
        return subagent_plan(self._workspace, run.sandbox_id, self._backends[run.agent_id])

    async def drive(self, run: Run, services: Mapping[str, Service]) -> None:
        """The run's task: ends when the run has reported. Cancelling it cancels the
        run (`Run.cancel` says why)."""
        sb: SupervisedSandbox | None = None
        try:
            try:
                async with asyncio.timeout(run.timeout_s):
                    await self._store.append(run.child_key, {"role": "user", "id": run.run_id, "text": run.task, "ts": time.time(), "agentId": run.agent_id, "spawnedBy": run.parent_key, "label": run.label})
                    sb = await self._sandboxes.add_running(self._plan(run), services=services)
                    try:
                        state = await sb.start(self._start_timeout_s)
                    except TimeoutError:  # the start's own bound, not the run's
                        raise ClawsupError(f"its sandbox did not start within {self._start_timeout_s:g} s") from None
                    if state is not SandboxState.READY:
                        last = sb.lc.last_exit.describe() if sb.lc.last_exit else state.value
                        raise ClawsupError(f"its sandbox did not start: {last}")
                    text, error = await sb.run_agent(run.run_id, run.task, max_iterations=self._max_iterations, timeout=run.timeout_s + 5)
                run.end("failed" if error else "succeeded", text, error)
            except TimeoutError:
                run.end("timed_out", "", f"did not finish within {run.timeout_s:g} s (runTimeoutSeconds); its sandbox was killed")
            except SandboxDied as e:
                tail = f"; last stderr: {' | '.join(e.stderr_tail[-3:])}" if e.stderr_tail else ""
                run.end("failed", "", f"its sandbox {e.status.describe()}{tail}; see `clawsup logs {run.sandbox_id}`")
            except (ClawsupError, OSError) as e:
                run.end("failed", "", str(e))
            except asyncio.CancelledError:
                run.end("cancelled", "", run.cancel_reason or "cancelled")
                raise
            except Exception as e:
                logger.exception("subagent run {} failed in the supervisor", run.run_id)
                run.end("failed", "", f"supervisor error: {type(e).__name__}: {e}")
        finally:
            await self._wind_down(run, sb)

    async def _wind_down(self, run: Run, sb: SupervisedSandbox | None) -> None:
        """Children first (a run takes its subtree with it), then its sandboxes, then
        the record and the announce. Bounded throughout: cancellation of the run's
        own task has already been delivered, so these awaits run to completion."""
        running = [c for c in run.children if c.running]
        for c in running:
            c.cancel(f"its parent run {run.run_id} ended ({run.status})")
        handles = [c.task_handle for c in running if c.task_handle is not None]
        if handles:
            await asyncio.wait(handles, timeout=STOP_TIMEOUT_S)
        if sb is not None:
            await self._sandboxes.discard(sb, f"run {run.status}", STOP_TIMEOUT_S, polite=run.status == "succeeded", remove_files=True)
        if run.fresh_workspace and (ws := self._sandboxes.sandboxes.get(run.workspace)) is not None:
            await self._sandboxes.discard(ws, "its run ended", STOP_TIMEOUT_S, remove_files=True)
        level = "info" if run.status == "succeeded" else "warning"
        logger.log(level.upper(), "subagent run {} ({}) {}: {}", run.run_id, run.label, run.status, run.reason or "done")
        if self._hooks is not None:
            ended = {"runId": run.run_id, "childSessionKey": run.child_key, "agentId": run.agent_id, "label": run.label, "status": run.status, "reason": run.reason}
            self._hooks.observe("subagent_ended", ended)
            self._hooks.observe("session_end", {"sessionKey": run.child_key, "agentId": run.agent_id, "reason": f"subagent run {run.status}"})
        try:
            await self._reports.deliver(run)
        finally:
            run.reported.set()
