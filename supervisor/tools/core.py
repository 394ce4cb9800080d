"""The core tools, the ones the supervisor itself provides (`exec`, `read`, `write`,
`edit`, `list_dir`: OpenClaw's names, so `group:fs` and `group:runtime` carry over):
their input schemas as pydantic models, their descriptions, and their registration
under the owner `core`.

The registrations stay while a workspace sandbox restarts (a call meanwhile gets
`SandboxUnavailable`). The tools run in workspace sandboxes
(supervisor/tools/workspaces.py); a call reaches them through the dispatcher
(supervisor/tools/dispatch.py). Arguments are the model's, so they are checked here,
at the edge, by pydantic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clawsup.sandbox.manifest import format_validation_error
from clawsup.supervisor.errors import BadToolArguments
from clawsup.supervisor.sandboxes.registry import CORE_OWNER, Kind, Registration, Registry


class CoreArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ExecArgs(CoreArgs):
    command: str = Field(min_length=1, max_length=100_000, description="A shell command, run with /bin/sh -c in the workspace.")
    workdir: str | None = Field(default=None, description="A folder inside the workspace to run in (default: the workspace).")
    timeout: float | None = Field(default=None, gt=0, description="Seconds before the command is stopped (default 60).")


class ReadArgs(CoreArgs):
    path: str = Field(min_length=1)
    offset: int | None = Field(default=None, ge=1)
    limit: int | None = Field(default=None, ge=1)


class WriteArgs(CoreArgs):
    path: str = Field(min_length=1)
    content: str


class EditArgs(CoreArgs):
    path: str = Field(min_length=1)
    old_string: str = Field(min_length=1)
    new_string: str


class ListDirArgs(CoreArgs):
    path: str = "."


@dataclass(frozen=True)
class CoreTool:
    name: str
    description: str
    args: type[CoreArgs]

    def parse(self, args: dict[str, Any] | str) -> CoreArgs:
        """The call's arguments, or BadToolArguments saying what does not fit."""
        try:
            if isinstance(args, str):
                return self.args.model_validate_json(args or "{}")
            return self.args.model_validate(args)
        except ValidationError as e:
            raise BadToolArguments(self.name, format_validation_error(e)) from None


CORE_TOOLS: dict[str, CoreTool] = {
    t.name: t
    for t in (
        CoreTool(
            "exec",
            "Run a shell command in your workspace sandbox. Returns its output (head and tail when long), exit code "
            "or signal, and whether it timed out. Dangerous commands are refused before they run.",
            ExecArgs,
        ),
        CoreTool("read", "Read a text file of the workspace. Long files: pass offset (first line, 1-based) and limit (lines).", ReadArgs),
        CoreTool("write", "Create or overwrite a file in the workspace; missing parent folders are created.", WriteArgs),
        CoreTool("edit", "Replace one exact, unique occurrence of old_string with new_string in a workspace file.", EditArgs),
        CoreTool("list_dir", "List a folder of the workspace: names, types, and sizes of files.", ListDirArgs),
    )
}


def register_core_tools(registry: Registry) -> None:
    for t in CORE_TOOLS.values():
        schema = t.args.model_json_schema()
        schema.pop("title", None)
        registry.register(
            Registration(kind=Kind.TOOL, name=t.name, owner=CORE_OWNER, sandbox_id=None, description=t.description, input_schema=schema)
        )
