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

from clawsup.supervisor.tools.schemas import CompiledSchema, SchemaRefused, compile_schema, compile_schemas_off_loop
from clawsup.supervisor.errors import RegistrationRefused
from clawsup.supervisor.names import owner_label

CORE_OWNER = "core"
# What a tool's metadata may weigh: it is kept here and sent to the model on every
# turn, so a plugin's 20 MB description would cost every conversation
# (tests/test_trust.py::test_oversized_metadata_is_refused).
MAX_DESCRIPTION_CHARS = 4096
MAX_SCHEMA_BYTES = 32 * 1024
# What one plugin's input schemas may weigh in all: compiling them (0.3 s for 31 KB)
# is what a start of the plugin costs the supervisor, at every restart.
MAX_PLUGIN_SCHEMA_BYTES = 512 * 1024


@dataclass(frozen=True)
class Swap:
    """What `Registry.replace_owned` changed for one owner and kind."""

    held: int
    added: list[str]
    removed: list[str]
    refused: dict[str, str]
    """Name -> why, for those of the new list that were not registered."""


class Kind(enum.Enum):
    TOOL = "tool"
    CHANNEL = "channel"
    HOOK = "hook"
    SERVICE = "service"
    COMMAND = "command"
    HTTP_ROUTE = "http_route"

    @property
    def exclusive(self) -> bool:
        """One owner per name (a tool, a command, a channel id). Many plugins hook
        `before_tool_call`, and a service's id or a route's path is its plugin's own."""
        return self in (Kind.TOOL, Kind.COMMAND, Kind.CHANNEL)


@dataclass(frozen=True, kw_only=True)
class OfferSpec:
    """An offer beyond tools, as its host described it (host.proto `Offer`), kept
    with its registration for whoever runs it (hooks, commands, channels, routes)."""

    kind: str
    name: str
    priority: int = 0
    description: str = ""
    accepts_args: bool = False
    owner_only: bool = True
    auth: str = "gateway"


def _key(kind: Kind, name: str, owner: str) -> tuple[Kind, str]:
    return (kind, name) if kind.exclusive else (kind, f"{name}\x00{owner}")


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
    arguments: CompiledSchema | None = field(default=None, compare=False, repr=False)
    """`input_schema` compiled: what every call's arguments are checked against
    (supervisor/tools/arguments.py). Set by `Registry.register` for a tool, or before it, off
    the loop, by `with_compiled_schemas`."""
    offer: OfferSpec | None = None
    """For an offer beyond tools: what its host said of it (priority, auth...)."""


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
            if kind is Kind.TOOL and name in self.reserved:
                lost[name] = CORE_OWNER
                continue
            holder = self._claims.setdefault((kind, name), owner)
            if holder != owner:
                lost[name] = holder
        return lost

    def claimable(self, owner: str, kind: Kind, names: frozenset[str]) -> list[str]:
        """Those of `names` that `owner` may hold: not reserved, not claimed first by
        another owner. What a plugin's host is allowed to serve at all."""
        return sorted(n for n in names if not (kind is Kind.TOOL and n in self.reserved) and self._claims.get((kind, n), owner) == owner)

    def refusal(self, reg: Registration, *, declared: frozenset[str] | None = None) -> str | None:
        """Why `reg` may not be registered, judged without compiling its schema; None
        if it may. `declared` is the manifest's contract for this kind; None means the
        owner is core and needs none."""
        if declared is not None and reg.name not in declared:
            return f"its manifest does not declare it in contracts.{reg.kind.value}s"
        if reg.owner != CORE_OWNER and reg.kind is Kind.TOOL and reg.name in self.reserved:
            return "the name belongs to a core tool"
        if len(reg.description) > MAX_DESCRIPTION_CHARS:
            return f"its description has {len(reg.description)} characters; the most is {MAX_DESCRIPTION_CHARS}"
        try:
            schema_size = len(json.dumps(reg.input_schema))
        except RecursionError:
            return "its input schema is nested too deeply to check"
        except (TypeError, ValueError) as e:
            return f"its input schema is not JSON ({e})"
        if schema_size > MAX_SCHEMA_BYTES:
            return f"its input schema is {schema_size} bytes of JSON; the most is {MAX_SCHEMA_BYTES}"
        if not isinstance(reg.input_schema, dict) or reg.input_schema.get("type", "object") != "object":
            return 'its input schema must be a JSON Schema object with "type": "object"'
        held = self._by_key.get(_key(reg.kind, reg.name, reg.owner))
        if held is not None and held.owner != reg.owner:
            return f"{owner_label(held.owner)} already holds it"
        claimant = self._claims.get((reg.kind, reg.name), reg.owner)
        if claimant != reg.owner:
            return f"{owner_label(claimant)} already holds it (loaded first)"
        return None

    def register(self, reg: Registration, *, declared: frozenset[str] | None = None) -> Registration:
        """Add one registration or raise `RegistrationRefused` (which the caller logs;
        the owner's other registrations are unaffected). A tool's schema is compiled
        here unless `reg.arguments` holds it compiled already (a plugin's are, off the
        loop: `with_compiled_schemas`)."""
        why = self.refusal(reg, declared=declared)
        if why is not None:
            raise RegistrationRefused(reg.owner, reg.name, why)
        if reg.kind is Kind.TOOL and reg.arguments is None:
            # Compiled here, once: a call then pays one validation, not a compile.
            try:
                reg = replace(reg, arguments=compile_schema(reg.input_schema))
            except SchemaRefused as e:
                raise RegistrationRefused(reg.owner, reg.name, f"its input schema {e}") from None
        self._by_key[_key(reg.kind, reg.name, reg.owner)] = reg
        return reg

    def replace_owned(self, owner: str, kind: Kind, regs: list[Registration], *, declared: frozenset[str] | None = None) -> Swap:
        """Swap `owner`'s registrations of `kind` for `regs`, in one step (no await,
        so no caller ever sees a mix of the old and the new): an MCP server whose tool
        list changed at run time. Each is judged again as `register` judges it (another
        owner may have taken a name while the new list was compiled off the loop);
        those refused are simply absent afterwards."""
        if any(r.owner != owner or r.kind is not kind for r in regs):
            raise ValueError(f"replace_owned({owner!r}, {kind.value}) was handed another owner's or kind's registration")
        old = {r.name: r for r in self._by_key.values() if r.owner == owner and r.kind is kind}
        for name in old:
            del self._by_key[_key(kind, name, owner)]
        refused: dict[str, str] = {}
        for reg in regs:
            try:
                self.register(reg, declared=declared)
            except RegistrationRefused as e:
                refused[reg.name] = e.reason
        new = {r.name for r in self._by_key.values() if r.owner == owner and r.kind is kind}
        added, removed = sorted(new - old.keys()), sorted(old.keys() - new)
        if added or removed:
            logger.info("{} now holds {} {}(s): added {}; removed {}", owner, len(new), kind.value, ", ".join(added) or "none", ", ".join(removed) or "none")
        return Swap(held=len(new), added=added, removed=removed, refused=refused)

    def reclaim(self, owner: str) -> list[Registration]:
        """Remove everything `owner` holds, in one step, and return it. Called on
        every death of a sandbox, before its callers are told
        (tests/test_faults.py asserts `tools list` is empty of it right after)."""
        gone = [r for r in self._by_key.values() if r.owner == owner]
        for r in gone:
            del self._by_key[_key(r.kind, r.name, r.owner)]
        if gone:
            logger.info("reclaimed {} registration(s) of {}: {}", len(gone), owner, ", ".join(r.name for r in gone))
        return gone

    def get(self, kind: Kind, name: str, owner: str | None = None) -> Registration | None:
        """The registration of `name`; for a kind that is not exclusive, `owner`'s."""
        if not kind.exclusive:
            return self._by_key.get(_key(kind, name, owner)) if owner is not None else None
        return self._by_key.get((kind, name))

    def of_kind(self, kind: Kind) -> list[Registration]:
        """Every registration of `kind`, by name then owner."""
        return sorted((r for r in self._by_key.values() if r.kind is kind), key=lambda r: (r.name, r.owner))

    def tools(self) -> list[Registration]:
        return sorted((r for r in self._by_key.values() if r.kind is Kind.TOOL), key=lambda r: r.name)

    def owned_by(self, owner: str) -> list[Registration]:
        return [r for r in self._by_key.values() if r.owner == owner]


async def with_compiled_schemas(regs: list[Registration]) -> list[Registration | str]:
    """Each of one plugin's tool registrations with its input schema compiled, or why
    the schema is refused; compiled in a schema worker, off the event loop, within
    MAX_PLUGIN_SCHEMA_BYTES in all (tests/test_hostile_bounds.py::
    test_a_plugins_registration_does_not_stall_other_callers). The registry is not
    touched: `register` then adds them on the loop."""
    compiled = await compile_schemas_off_loop([r.input_schema for r in regs], max_total_bytes=MAX_PLUGIN_SCHEMA_BYTES)
    return [f"its input schema {c}" if isinstance(c, SchemaRefused) else replace(r, arguments=c) for r, c in zip(regs, compiled, strict=True)]
