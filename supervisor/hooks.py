"""Where the gateway runs its plugins' hooks (`api.on(name, handler, priority)`), each
in the plugin's sandbox over gRPC with the deadline the operator gave that plugin
(`plugins.entries.<id>.hooks.timeoutSeconds`).

Three ways a hook runs (sandbox/offers.py names which hook runs which way):
- a **gate** (`before_tool_call`) is asked before the call it guards, one plugin
  after another, higher priority first; it may block the call or change its
  arguments. It **fails closed**: a gate that errs, overruns, answers nonsense, or
  whose plugin is down or restarting refuses the call, naming the plugin and what
  happened, unless the operator set `failOpen` for that plugin. A gate is known from
  its plugin's plan (its manifest declares the hook), not from its registration, so a
  dead plugin's gate still guards: its death reclaims the registration, not the duty.
- the other **modifying** hooks (`message_sending`, `before_agent_start`) run the same
  way, but one that fails is skipped (logged): they shape a reply, they guard nothing.
- **observing** hooks are queued and run in the background by `run`'s workers, in
  parallel, each within its deadline: they never hold up what they observe. Past
  MAX_PENDING waiting, or PER_PLUGIN of one plugin's waiting or running, new events
  are dropped and counted: a plugin whose observers hang holds at most its share of
  the workers, and the other plugins' events still run.

What a hook sees is what it needs, and content only where granted: a plugin's tool
hooks see other plugins' tools only if the operator listed the hook in its
`hooks.allow` (its own tools otherwise); the message and agent hooks are registered
only where granted (supervisor/sandboxes/offers.py).

Created by the gateway after the sandbox manager; `run(stop)` is owned by the
gateway's task group.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from loguru import logger

from clawsup.supervisor.errors import ClawsupError, ErrorCode, OfferFailed
from clawsup.supervisor.sandboxes.lifecycle import SandboxState
from clawsup.supervisor.sandboxes.registry import Kind, Registry
from clawsup.supervisor.sandboxes.supervised import SupervisedSandbox

MAX_PENDING = 1024
"""Observing hook calls waiting for a worker; past it an event is dropped (counted)."""
WORKERS = 16
"""Observing hook calls in flight at once."""
PER_PLUGIN = 4
"""One plugin's observing hook calls waiting or in flight at once."""
MAX_CONTEXT_CHARS = 16 * 1024
"""What one `before_agent_start` hook may prepend."""
MAX_RESULT_CHARS = 16 * 1024
"""What `after_tool_call` shows of a result."""
MAX_REASON_CHARS = 500
MAX_REPLY_CHARS = 100_000
"""What a `message_sending` hook may make of a reply (a channel message's own cap)."""


class HookObserver(Protocol):
    """What the parts that only report (subagent runs) need of `Hooks`."""

    def observe(self, hook: str, event: dict[str, Any]) -> None: ...


class BlockedByHook(ClawsupError):
    """A gate refused a tool call: it said no, or it could not be asked (fail closed)."""

    code: ClassVar[ErrorCode] = "blocked_by_hook"

    def __init__(self, tool: str, plugin: str, reason: str) -> None:
        self.tool = tool
        self.plugin = plugin
        self.reason = reason
        super().__init__(f"tool {tool!r} was refused by the before_tool_call hook of plugin {plugin!r}: {reason}")


@dataclass(frozen=True)
class _Event:
    sb: SupervisedSandbox
    hook: str
    payload: dict[str, Any]


class Hooks:
    def __init__(self, sandboxes: Mapping[str, SupervisedSandbox], registry: Registry) -> None:
        self._sandboxes = sandboxes
        self._registry = registry
        # Which plugins declare each hook: fixed by the plans (the manifests), so a
        # call with no hook declared anywhere pays one dict lookup.
        self._declared: dict[str, list[SupervisedSandbox]] = {}
        for sb in sandboxes.values():
            if sb.plan.role != "plugin":
                continue
            for hook in sb.plan.offers.declares("hook"):
                self._declared.setdefault(hook, []).append(sb)
        self._queue: asyncio.Queue[_Event] = asyncio.Queue(MAX_PENDING)
        self._held: dict[str, int] = {}
        """Plugin id -> its observing calls queued or running (PER_PLUGIN)."""
        self.dropped = 0

    def declared(self, hook: str) -> bool:
        return hook in self._declared

    # -- the gate ------------------------------------------------------------------

    async def before_tool_call(self, tool: str, owner: str, args: dict[str, Any], *, agent: str | None, session: str | None) -> dict[str, Any]:
        """The arguments the call goes on with (changed or not). Raises BlockedByHook."""
        gates = self._declared.get("before_tool_call")
        if not gates:
            return args
        for sb in self._chain("before_tool_call", [g for g in gates if _sees(g, owner, "before_tool_call")]):
            event = {"toolName": tool, "params": args, "toolOwner": owner, "agentId": agent, "sessionKey": session}
            pid = sb.plan.plugin_id
            try:
                if self._registry.get(Kind.HOOK, "before_tool_call", owner=pid) is None:
                    if sb.lc.state is SandboxState.READY:
                        continue  # up, and it did not register the hook: no gate
                    raise OfferFailed("hook", "before_tool_call", pid, "down", f"is not available: its sandbox is {sb.lc.state.value}")
                answer = await sb.call_offer("hook", "before_tool_call", event, sb.plan.offers.hook_timeout_s)
                verdict = _gate_answer(answer)
            except (OfferFailed, _BadAnswer) as e:
                said = f"it {e.message}" if isinstance(e, OfferFailed) else str(e)
                if sb.plan.offers.fail_open:
                    self._failed(sb, "before_tool_call", f"{said}; the call goes on (failOpen)")
                    continue
                self._failed(sb, "before_tool_call", f"{said}; the call to {tool!r} is refused (the gate fails closed)")
                raise BlockedByHook(tool, pid, f"{said}; the gate fails closed (plugins.entries.{pid}.hooks.failOpen would let calls through)") from None
            if verdict is None:
                continue
            if isinstance(verdict, str):
                sb.log.event(f"hook before_tool_call blocked {tool!r}: {verdict}")
                raise BlockedByHook(tool, pid, verdict)
            args = verdict
        return args

    def after_tool_call(
        self, tool: str, owner: str, args: dict[str, Any], *, result: str | None, error: str | None, duration_s: float, agent: str | None, session: str | None
    ) -> None:
        hooked = self._declared.get("after_tool_call")
        if not hooked:
            return
        event = {
            "toolName": tool, "params": args, "toolOwner": owner, "agentId": agent, "sessionKey": session,
            "result": result[:MAX_RESULT_CHARS] if result is not None else None, "error": error, "durationMs": round(duration_s * 1000, 3),
        }  # fmt: skip
        for sb in hooked:
            if _sees(sb, owner, "after_tool_call"):
                self._enqueue(sb, "after_tool_call", event)

    # -- the other modifying hooks ---------------------------------------------------

    async def message_sending(self, text: str, *, channel: str, peer_kind: str, peer_id: str, session: str, agent: str) -> str | None:
        """The reply as the hooks leave it; None when one cancelled it."""
        for sb in self._chain("message_sending", self._registered("message_sending")):
            event = {"content": text, "channel": channel, "to": {"kind": peer_kind, "id": peer_id}, "sessionKey": session, "agentId": agent}
            answer = await self._modify(sb, "message_sending", event)
            if not isinstance(answer, dict):
                continue
            if answer.get("cancel") is True:
                sb.log.event(f"hook message_sending cancelled a reply in {session}")
                return None
            if isinstance(answer.get("content"), str):
                text = answer["content"][:MAX_REPLY_CHARS]
        return text

    async def before_agent_start(self, prompt: str, *, agent: str, session: str, channel: str) -> str:
        """What the hooks prepend to this turn's context ("" for nothing)."""
        parts: list[str] = []
        for sb in self._chain("before_agent_start", self._registered("before_agent_start")):
            event = {"prompt": prompt, "agentId": agent, "sessionKey": session, "channel": channel}
            answer = await self._modify(sb, "before_agent_start", event)
            if isinstance(answer, dict) and isinstance(answer.get("prependContext"), str) and answer["prependContext"].strip():
                parts.append(answer["prependContext"][:MAX_CONTEXT_CHARS])
        return "\n\n".join(parts)

    async def _modify(self, sb: SupervisedSandbox, hook: str, event: dict[str, Any]) -> Any:
        try:
            return await sb.call_offer("hook", hook, event, sb.plan.offers.hook_timeout_s)
        except OfferFailed as e:
            self._failed(sb, hook, f"{e}; skipped")
            return None

    # -- observing hooks ---------------------------------------------------------------

    def observe(self, hook: str, event: dict[str, Any]) -> None:
        """Queue `event` for every plugin that registered `hook`; never waits."""
        if hook not in self._declared:
            return
        for sb in self._registered(hook):
            self._enqueue(sb, hook, event)

    async def gateway_stop(self) -> None:
        """`gateway_stop`, awaited (in parallel, each within its deadline) before the
        sandboxes are told to stop, so that the plugins hear it while they run."""
        hooked = self._registered("gateway_stop")
        if not hooked:
            return
        async with asyncio.TaskGroup() as tg:
            for sb in hooked:
                tg.create_task(self._call_quietly(_Event(sb, "gateway_stop", {"reason": "stopping"})))

    def _enqueue(self, sb: SupervisedSandbox, hook: str, event: dict[str, Any]) -> None:
        pid = sb.plan.plugin_id
        try:
            if self._held.get(pid, 0) >= PER_PLUGIN:
                raise asyncio.QueueFull
            self._queue.put_nowait(_Event(sb, hook, event))
            self._held[pid] = self._held.get(pid, 0) + 1
        except asyncio.QueueFull:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                logger.warning("observing hooks fall behind: {} event(s) dropped so far (the latest: {} of plugin {!r})", self.dropped, hook, sb.plan.plugin_id)

    async def run(self, stop: asyncio.Event) -> None:
        """The observing hooks' workers, until `stop`; what is still queued then is
        dropped (the plugins are being stopped too)."""

        async def worker() -> None:
            while True:
                ev = await self._queue.get()
                try:
                    await self._call_quietly(ev)
                finally:
                    self._held[ev.sb.plan.plugin_id] -= 1

        async with asyncio.TaskGroup() as tg:
            workers = [tg.create_task(worker(), name=f"hook worker {i}") for i in range(WORKERS)]
            await stop.wait()
            for w in workers:
                w.cancel()

    async def _call_quietly(self, ev: _Event) -> None:
        if self._registry.get(Kind.HOOK, ev.hook, owner=ev.sb.plan.plugin_id) is None:
            return  # reclaimed meanwhile (its plugin died): an observer guards nothing
        try:
            await ev.sb.call_offer("hook", ev.hook, ev.payload, ev.sb.plan.offers.hook_timeout_s)
        except OfferFailed as e:
            self._failed(ev.sb, ev.hook, str(e))
        except Exception:
            # A bug of ours must cost this event, never the workers (whose group is
            # the gateway's).
            logger.exception("{}: observing hook {} failed in the supervisor", ev.sb.id, ev.hook)

    # -- helpers -----------------------------------------------------------------------

    def _registered(self, hook: str) -> list[SupervisedSandbox]:
        return [sb for sb in self._declared.get(hook, ()) if self._registry.get(Kind.HOOK, hook, owner=sb.plan.plugin_id) is not None]

    def _chain(self, hook: str, sbs: list[SupervisedSandbox]) -> list[SupervisedSandbox]:
        """Higher priority first; a plugin that is down keeps its place at 0."""

        def priority(sb: SupervisedSandbox) -> int:
            reg = self._registry.get(Kind.HOOK, hook, owner=sb.plan.plugin_id)
            return reg.offer.priority if reg is not None and reg.offer is not None else 0

        return sorted(sbs, key=lambda sb: (-priority(sb), sb.plan.plugin_id))

    def _failed(self, sb: SupervisedSandbox, hook: str, said: str) -> None:
        sb.log.event(f"hook {hook}: {said}")
        logger.warning("{}: hook {}: {}", sb.id, hook, said)


class _BadAnswer(Exception):
    """A gate's answer that is none of the shapes it may take."""


def _gate_answer(answer: Any) -> dict[str, Any] | str | None:
    """A gate's answer: None (go on), the new arguments, or the reason it blocked."""
    if answer is None:
        return None
    if not isinstance(answer, dict):
        raise _BadAnswer(f"its answer is a JSON {type(answer).__name__}, not an object (or null)")
    if answer.get("block"):
        reason = answer.get("blockReason")
        return " ".join(str(reason).split())[:MAX_REASON_CHARS] if reason else "blocked, no reason given"
    if "params" in answer:
        if not isinstance(answer["params"], dict):
            raise _BadAnswer("its answer's params is not an object")
        return dict(answer["params"])
    return None


def _sees(sb: SupervisedSandbox, tool_owner: str, hook: str) -> bool:
    """A plugin's tool hook sees its own tools, and others' only where that hook is
    granted: leave to watch results (after_tool_call) is not leave to rewrite calls."""
    return tool_owner == sb.plan.plugin_id or hook in sb.plan.offers.hooks_allow

