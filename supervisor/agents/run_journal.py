"""The subagent runs sessions are waiting to hear from, on disk (`<state>/runs.jsonl`),
so that every run is reported once even when the supervisor is not there to see it
end: killed (the run's host dies with it) or stopped while the run went on. At the
next start each such run is announced to its session: with the report it could not
deliver, or as failed, with what its own session file says it did.

Only runs spawned by a session are written: a nested run's parent is itself a run,
and is gone with the supervisor. One JSON object per line, appended with a single
write (a torn last line, from a crash mid-write, is skipped):

  {"event": "spawned", "runId", "label", "agentId", "childKey", "ts", "origin": {...}}
  {"event": "ended", "runId", "text"}       a report the supervisor could not deliver
  {"event": "reported", "runId"}          once the report is in the session

Created by the gateway; used by supervisor/agents/subagents.py.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from loguru import logger

from clawsup.supervisor.messages.bus import ReplyTarget
from clawsup.supervisor.messages.routing import Peer, Route, RouteInput

COMPACT_EVERY = 1000
"""Reports between rewrites of the file down to the runs still going."""


class RunJournal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._live: dict[str, dict[str, Any]] = {}
        """Spawned and not yet reported, in this life of the supervisor."""
        self._reports = 0

    def spawned(self, record: dict[str, Any]) -> None:
        self._live[record["runId"]] = record
        self._append({"event": "spawned", **record})

    def ended(self, run_id: str, text: str) -> None:
        self._append({"event": "ended", "runId": run_id, "text": text})

    def reported(self, run_id: str) -> None:
        self._live.pop(run_id, None)
        self._append({"event": "reported", "runId": run_id})
        self._reports += 1
        if self._reports % COMPACT_EVERY == 0:
            self._rewrite([{"event": "spawned", **r} for r in self._live.values()])

    def unreported(self) -> list[dict[str, Any]]:
        """Runs of an earlier life that were spawned and never reported, each with
        the text of its undelivered report (`ended`) when there was one. The file is
        rewritten down to them: the caller reports them now, and each stays here
        until its report is in its session (`reported`)."""
        runs: dict[str, dict[str, Any]] = {}
        try:
            lines = self.path.read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            return []
        for n, line in enumerate(lines, 1):
            try:
                e = json.loads(line)
                event, run_id = e["event"], e["runId"]
            except (ValueError, KeyError, TypeError):
                logger.warning("{}:{}: not a run record; skipped", self.path, n)
                continue
            if event == "spawned":
                runs[run_id] = e
            elif event == "ended" and run_id in runs:
                runs[run_id]["ended"] = e.get("text", "")
            elif event == "reported":
                runs.pop(run_id, None)
        self._rewrite([{**r, "event": "spawned"} for r in runs.values()])
        for r in runs.values():
            self._live[r["runId"]] = {k: v for k, v in r.items() if k != "event"}
        return list(runs.values())

    def _append(self, obj: dict[str, Any]) -> None:
        line = json.dumps(obj, separators=(",", ":")) + "\n"
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError as e:
            # The journal is the safety net, not the run: a run goes on without it.
            logger.error("{}: cannot record a run: {}", self.path, e)

    def _rewrite(self, records: list[dict[str, Any]]) -> None:
        tmp = self.path.with_suffix(".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode())
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError as e:
            logger.error("{}: cannot rewrite: {}", self.path, e)


def origin_json(source: RouteInput, reply_to: ReplyTarget, route: Route) -> dict[str, Any]:
    return {"source": asdict(source), "replyTo": asdict(reply_to), "route": asdict(route)}


def origin_from(d: dict[str, Any]) -> tuple[RouteInput, ReplyTarget, Route]:
    s, r = dict(d["source"]), dict(d["replyTo"])
    s["peer"] = Peer(**s["peer"])
    s["parent_peer"] = Peer(**s["parent_peer"]) if s.get("parent_peer") else None
    s["member_role_ids"] = tuple(s.get("member_role_ids") or ())
    r["peer"] = Peer(**r["peer"])
    route = dict(d["route"])
    route["warnings"] = tuple(route.get("warnings") or ())
    return RouteInput(**s), ReplyTarget(**r), Route(**route)
