"""Who holds which name. Every registration carries its owner, and an owner's
registrations leave together.

Created once by the gateway and shared by everything that registers or looks up:
plugin sandboxes today, core tools and channels in later layers. Lives as long as the
supervisor. Not thread-safe by design: only the supervisor's event loop touches it.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field, replace
from typing import Any

from loguru import logger

from supervisor.arguments import ArgumentsCheck, SchemaRefused, compile_arguments
from supervisor.errors import RegistrationRefused

CORE_OWNER = "core"
# What a tool's metadata may weigh: it is kept here and sent to the model on every
# turn, so a plugin's 20 MB description would cost every conversation
# (tests/test_trust.py::test_oversized_metadata_is_refused).
MAX_DESCRIPTION_CHARS = 4096
MAX_SCHEMA_BYTES = 32 * 1024


class Kind(enum.Enum):
    TOOL = "tool"
    CHANNEL = "channel"
    HOOK = "hook"
    SERVICE = "service"


@dataclass(frozen=True, kw_only=True)
class Registration:
    kind: Kind
    name: str
    owner: str
    """A plugin id, or `core`."""
    sandbox_id: str | None
    """The sandbox that serves it; None for core registrations."""
    description: str = ""
    input_schema: dict[str, Any] = field(default_factory=dict)
    arguments: ArgumentsCheck | None = field(default=None, compare=False, repr=False)
    """`input_schema` compiled, set by `Registry.register` for a tool: what every call's
    arguments are checked against (supervisor/arguments.py)."""


@dataclass
class Registry:
    reserved: frozenset[str] = frozenset()
    """Names that core tools hold or will hold; no plugin may take them."""
    _by_key: dict[tuple[Kind, str], Registration] = field(default_factory=dict)
    _claims: dict[tuple[Kind, str], str] = field(default_factory=dict)
    """Which owner a declared name belongs to, decided by load order when the
    plugins are added. Without it, plugins that start in parallel (or one that
    restarts while another is down) would win a contested name by timing."""

    def claim(self, owner: str, kind: Kind, names: frozenset[str]) -> dict[str, str]:
        """Record `owner`'s declared names; return those another owner claimed first,
        with that owner. Claims outlive the registrations (and reclaim)."""
        lost = {}
        for name in sorted(names):
            if name in self.reserved:
                lost[name] = CORE_OWNER
                continue
            holder = self._claims.setdefault((kind, name), owner)
            if holder != owner:
                lost[name] = holder
        return lost

    def claimable(self, owner: str, kind: Kind, names: frozenset[str]) -> list[str]:
        """Those of `names` that `owner` may hold: not reserved, not claimed first by
        another owner. What a plugin's host is allowed to serve at all."""
        return sorted(n for n in names if n not in self.reserved and self._claims.get((kind, n), owner) == owner)

    def register(self, reg: Registration, *, declared: frozenset[str] | None = None) -> Registration:
        """Add one registration or raise `RegistrationRefused` (which the caller logs;
        the owner's other registrations are unaffected). `declared` is the manifest's
        contract for this kind; None means the owner is core and needs none."""
        if declared is not None and reg.name not in declared:
            raise RegistrationRefused(reg.owner, reg.name, f"its manifest does not declare it in contracts.{reg.kind.value}s")
        if reg.owner != CORE_OWNER and reg.name in self.reserved:
            raise RegistrationRefused(reg.owner, reg.name, "the name belongs to a core tool")
        if len(reg.description) > MAX_DESCRIPTION_CHARS:
            raise RegistrationRefused(reg.owner, reg.name, f"its description has {len(reg.description)} characters; the most is {MAX_DESCRIPTION_CHARS}")
        try:
            schema_size = len(json.dumps(reg.input_schema))
        except RecursionError:
            raise RegistrationRefused(reg.owner, reg.name, "its input schema is nested too deeply to check") from None
        if schema_size > MAX_SCHEMA_BYTES:
            raise RegistrationRefused(reg.owner, reg.name, f"its input schema is {schema_size} bytes of JSON; the most is {MAX_SCHEMA_BYTES}")
        if not isinstance(reg.input_schema, dict) or reg.input_schema.get("type", "object") != "object":
            raise RegistrationRefused(reg.owner, reg.name, 'its input schema must be a JSON Schema object with "type": "object"')
        held = self._by_key.get((reg.kind, reg.name))
        if held is not None and held.owner != reg.owner:
            raise RegistrationRefused(reg.owner, reg.name, f"plugin {held.owner!r} already holds it")
        claimant = self._claims.get((reg.kind, reg.name), reg.owner)
        if claimant != reg.owner:
            raise RegistrationRefused(reg.owner, reg.name, f"plugin {claimant!r} already holds it (loaded first)")
        if reg.kind is Kind.TOOL:
            # Compiled here, once: a call then pays one validation, not a compile.
            try:
                reg = replace(reg, arguments=compile_arguments(reg.input_schema))
            except SchemaRefused as e:
                raise RegistrationRefused(reg.owner, reg.name, f"its input schema {e}") from None
        self._by_key[(reg.kind, reg.name)] = reg
        return reg

    def reclaim(self, owner: str) -> list[Registration]:
        """Remove everything `owner` holds, in one step, and return it. Called on
        every death of a sandbox, before its callers are told
        (tests/test_faults.py asserts `tools list` is empty of it right after)."""
        gone = [r for r in self._by_key.values() if r.owner == owner]
        for r in gone:
            del self._by_key[(r.kind, r.name)]
        if gone:
            logger.info("reclaimed {} registration(s) of {}: {}", len(gone), owner, ", ".join(r.name for r in gone))
        return gone

    def get(self, kind: Kind, name: str) -> Registration | None:
        return self._by_key.get((kind, name))

    def tools(self) -> list[Registration]:
        return sorted((r for r in self._by_key.values() if r.kind is Kind.TOOL), key=lambda r: r.name)

    def owned_by(self, owner: str) -> list[Registration]:
        return [r for r in self._by_key.values() if r.owner == owner]
