"""Which of the offers beyond tools a plugin's host described it may hold (hooks,
slash commands, services, channels, HTTP routes), judged against its manifest's
`contracts` and the operator's grants (`OfferGrant`, on its plan), and registered
under its name; a refusal is named in the sandbox's log and kept for
`clawsup plugins show`. The supervisor is the judge, never the host.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from loguru import logger

from clawsup.sandbox import offers
from clawsup.supervisor.errors import RegistrationRefused
from clawsup.supervisor.names import owner_label
from clawsup.supervisor.sandboxes.log import SandboxLog
from clawsup.supervisor.sandboxes.registry import Kind, OfferSpec, Registration, Registry

if TYPE_CHECKING:
    from clawsup.supervisor.sandboxes.plans import SandboxPlan

MAX_DESCRIBED_OFFERS = 1024
MAX_NAMED_REFUSALS = 16
MAX_DESCRIPTION_CHARS = 1024
CONTRACT_KEYS: Mapping[str, str] = {"hook": "hooks", "command": "commands", "service": "services", "channel": "channels", "http_route": "httpRoutes"}


@dataclass(frozen=True, kw_only=True)
class OfferGrant:
    """What one plugin may offer beyond tools: its manifest's contracts, and what the
    operator granted (`plugins.entries.<id>.hooks`, `.http`, `channels.<id>`)."""

    declared: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Offer kind -> the names its manifest's contracts declare."""
    hooks_allow: frozenset[str] = frozenset()
    fail_open: bool = False
    hook_timeout_s: float = 5.0
    command_timeout_s: float = 10.0
    http_plugin_auth: bool = False
    http_timeout_s: float = 10.0
    channels_enabled: frozenset[str] = frozenset()
    """The plugin channels the operator enabled (`channels.<id>`)."""

    def declares(self, kind: str) -> frozenset[str]:
        return self.declared.get(kind, frozenset())

    def granted(self, hook: str) -> bool:
        return hook not in offers.CONTENT_HOOKS or hook in self.hooks_allow

    def to_json(self) -> dict[str, object]:
        """For `clawsup plugins show`."""
        return {
            "hooksAllow": sorted(self.hooks_allow),
            "failOpen": self.fail_open,
            "hookTimeoutSeconds": self.hook_timeout_s,
            "commandTimeoutSeconds": self.command_timeout_s,
            "httpPluginAuth": self.http_plugin_auth,
            "httpTimeoutSeconds": self.http_timeout_s,
            "channelsEnabled": sorted(self.channels_enabled),
        }


class OfferAcceptance:
    """The judge of one sandbox's described offers. Created with its
    SupervisedSandbox; used once per incarnation, between Describe and READY (the
    death of the incarnation reclaims what it registered)."""

    def __init__(self, plan: SandboxPlan, registry: Registry, log: SandboxLog) -> None:
        self._plan = plan
        self._grant = plan.offers
        self._registry = registry
        self._log = log
        self._who = owner_label(plan.plugin_id)
        self.refusals: dict[str, str] = {}
        """`kind name` -> why it was refused, from the last Describe."""

    def accept(self, described: tuple[OfferSpec, ...]) -> list[Registration]:
        """Register what may be; name the refusals. Returns what was registered."""
        self.refusals = {}
        accepted: list[Registration] = []
        unnamed = max(0, len(described) - MAX_DESCRIBED_OFFERS)
        for spec in described[:MAX_DESCRIBED_OFFERS]:
            why = self._refusal(spec)
            if why is None:
                # Kept as shown (`/help`, `plugins show`): bounded, whatever the host sent.
                kept = replace(spec, description=spec.description[:MAX_DESCRIPTION_CHARS], priority=max(-1000, min(1000, spec.priority)))
                reg = Registration(kind=Kind(spec.kind), name=spec.name, owner=self._plan.plugin_id, sandbox_id=self._plan.sandbox_id, description=kept.description, offer=kept)
                try:
                    accepted.append(self._registry.register(reg))
                    continue
                except RegistrationRefused as e:
                    why = e.reason
            if len(self.refusals) >= MAX_NAMED_REFUSALS:
                unnamed += 1
                continue
            label = f"{spec.kind.replace('_', ' ')} {spec.name[:64]!r}"
            self.refusals[label] = why
            said = f"{self._who} may not offer {label}: {why}"
            self._log.event(f"refused: {said}")
            logger.warning("{}: {}", self._plan.sandbox_id, said)
        if unnamed:
            line = f"and {unnamed} more offer(s) it described were refused (not named one by one)"
            self.refusals["…"] = line
            self._log.event(line)
        if accepted:
            self._log.event("offers: " + ", ".join(f"{r.kind.value} {r.name}" for r in accepted))
        return accepted

    def _refusal(self, spec: OfferSpec) -> str | None:
        if spec.kind not in offers.OFFER_KINDS:
            return f"{spec.kind[:32]!r} is not a kind of offer"
        key = CONTRACT_KEYS[spec.kind]
        if spec.name not in self._grant.declares(spec.kind):
            return f"its manifest does not declare it in contracts.{key}"
        pid = self._plan.plugin_id
        if spec.kind == "hook":
            if spec.name not in offers.HOOKS:
                return "no such hook"
            if spec.name in offers.CONTENT_HOOKS and spec.name not in offers.GATE_HOOKS | {"after_tool_call"} and not self._grant.granted(spec.name):
                return f"it sees the text of sessions, which the operator has not granted (plugins.entries.{pid}.hooks.allow)"
        elif spec.kind == "channel":
            if spec.name in ("cli", "http"):
                return "that channel is built in"
            if spec.name not in self._grant.channels_enabled:
                return f"the operator has not enabled it (channels.{spec.name} in the config)"
        elif spec.kind == "http_route":
            if not offers.valid_route(spec.name):
                return "not a valid route path"
            if spec.auth not in ("gateway", "plugin"):
                return f"auth must be 'gateway' or 'plugin', not {spec.auth[:32]!r}"
            if spec.auth == "plugin" and not self._grant.http_plugin_auth:
                return f"it asks to check its callers itself (auth: plugin), which the operator has not allowed (plugins.entries.{pid}.http.allowPluginAuth)"
        elif spec.kind == "command" and spec.name in offers.BUILTIN_COMMANDS:
            return f"/{spec.name} belongs to the gateway"
        return None
