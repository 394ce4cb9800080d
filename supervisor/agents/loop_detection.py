"""Loop detection: the same tool call over and over in one turn (or one subagent
run), or the same file read again and again. A warning to the model first, then a
stop (`agentLoop.loopDetection`)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from clawsup.sandbox.agent_loop import UserMessage
from clawsup.supervisor.config import LoopDetectionConfig

WARNING = "You are repeating the same tool call with the same result. Change approach or answer with what you have."
STOPPED = "the same tool call kept repeating (loop detection)"

Verdict = Literal["stop", "warn", ""]


@dataclass
class LoopWatch:
    settings: LoopDetectionConfig
    seen: Counter[str] = field(default_factory=Counter)
    reads: Counter[str] = field(default_factory=Counter)
    warned: bool = False

    def record(self, name: str, args: dict[str, Any]) -> None:
        self.seen[f"{name} {json.dumps(args, sort_keys=True)}"] += 1
        if name == "read" and isinstance(args.get("path"), str):
            self.reads[args["path"]] += 1

    def verdict(self) -> Verdict:
        """`stop`, `warn` (the first time only), or empty."""
        d = self.settings
        if not d.enabled:
            return ""
        top = max(self.seen.values(), default=0)
        top_read = max(self.reads.values(), default=0)
        if top >= d.same_call_stop or top_read >= d.same_file_reads_stop:
            return "stop"
        if (top >= d.same_call_warn or top_read >= d.same_file_reads_warn) and not self.warned:
            self.warned = True
            return "warn"
        return ""

    def before_model_call(self) -> tuple[UserMessage, ...] | None:
        """What the next model call of the turn (or run) is given besides its
        messages: the warning, the first time. None: the call must not be made (`stop`)."""
        verdict = self.verdict()
        if verdict == "stop":
            return None
        return (UserMessage(WARNING, "warning"),) if verdict == "warn" else ()
