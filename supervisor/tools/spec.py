"""A tool as the supervisor knows it: its name, what it says it does, and the JSON
Schema of its arguments. One shape from the host's description through the registry
to what the model is shown."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class ToolSpec:
    name: str
    description: str
    input_schema: dict[str, Any]
