"""Loads one plugin folder inside the child, through pluggy, and says why when it
cannot: the message and the last frame in the plugin's own code (`LoadError`,
sandbox/handshake.py), which the host prints instead of its handshake."""

from __future__ import annotations

import importlib
import importlib.util
import linecache
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy

from clawsup.sandbox.api import PROJECT_NAME, PluginApi, PluginSpec
from clawsup.sandbox.handshake import LoadError

# How many declared names a "registered none" message lists before it counts.
NAMED_TOOLS = 10


class PluginLoadFailed(Exception):
    """A reason the host found itself, not an exception of the plugin's: its text
    is the whole message, and there is no traceback worth showing."""

    def __init__(self, message: str, where: str = "") -> None:
        super().__init__(message)
        self.where = where


def import_entry(folder: Path, plugin_id: str, entry: str) -> ModuleType:
    # The plugin may import its sibling modules by name.
    sys.path.insert(0, str(folder))
    if entry.endswith(".py"):
        path = (folder / entry).resolve()
        if not path.is_relative_to(folder.resolve()):
            raise PluginLoadFailed(f"the entry {entry!r} in clawsup.plugin.json points outside the plugin folder")
        if not path.is_file():
            raise PluginLoadFailed(f"the entry file {entry!r} named in clawsup.plugin.json does not exist in the plugin folder")
        name = f"clawsup_plugin_{plugin_id.replace('-', '_')}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise PluginLoadFailed(f"the entry file {entry!r} cannot be loaded as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    return importlib.import_module(entry)


def load_plugin(
    folder: Path, plugin_id: str, entry: str, config: dict[str, Any], workspace: Path, *, serve_only: list[str] | None = None
) -> PluginApi:
    """Import the entry module and run its `clawsup_register`. Whatever it raises
    propagates, for `load_error` to describe. `serve_only` (the start gate's `tools`):
    a tool registered outside it is kept aside, described but never served; a plugin
    that declares tools and registers none of them has failed to load too."""
    pm = pluggy.PluginManager(PROJECT_NAME)
    pm.add_hookspecs(PluginSpec)
    module = import_entry(folder, plugin_id, entry)
    pm.register(module, name=plugin_id)
    api = PluginApi(plugin_id=plugin_id, config=config, workspace=workspace)
    pm.hook.clawsup_register(api=api)
    if serve_only is None:
        return api
    # Serve exactly what the supervisor may accept: a name outside the gate's list is
    # dropped here, so no call can ever reach its handler. It is still described, so
    # that the supervisor logs its refusal.
    for name in [n for n in api.tools if n not in serve_only]:
        api.not_served[name] = api.tools.pop(name)
    if serve_only and not api.tools:
        raise PluginLoadFailed(*_registered_none(folder, module, pm, serve_only, api))
    return api


def _registered_none(folder: Path, module: ModuleType, pm: pluggy.PluginManager, declared: list[str], api: PluginApi) -> tuple[str, str]:
    names = ", ".join(declared[:NAMED_TOOLS]) + (f" and {len(declared) - NAMED_TOOLS} more" if len(declared) > NAMED_TOOLS else "")
    message = f"plugin declares tools {names} but registered none"
    impls = pm.hook.clawsup_register.get_hookimpls()
    where = ""
    if impls:
        code = getattr(impls[-1].function, "__code__", None)
        if code is not None and (rel := _inside(folder, code.co_filename)) is not None:
            where = f"{rel}:{_def_line(code.co_filename, code.co_firstlineno)} in clawsup_register"
    elif callable(getattr(module, "clawsup_register", None)):
        message += "; its clawsup_register lacks the @hookimpl mark (from clawsup.sandbox.api import hookimpl)"
    else:
        message += "; its entry module defines no clawsup_register"
    if api.not_served:
        others = sorted(api.not_served)
        message += f"; it registered only {', '.join(others[:NAMED_TOOLS])}, which it may not serve"
    return message, where


def _def_line(filename: str, first: int) -> int:
    """The `def` line of a function whose code starts at `first`: a decorated
    function's code starts at its first decorator (`@hookimpl`)."""
    lines = linecache.getlines(filename)
    for n in range(first, min(first + 20, len(lines)) + 1):
        if lines[n - 1].lstrip().startswith(("def ", "async def ")):
            return n
    return first


def load_error(exc: BaseException, folder: Path) -> LoadError:
    """What an operator needs from a failed load: the error in one line, and where in
    the plugin's own code it happened (never an importlib or pluggy frame)."""
    if isinstance(exc, PluginLoadFailed):
        return LoadError(message=_one_line(str(exc)), where=exc.where)
    where = ""
    if isinstance(exc, SyntaxError) and exc.filename:
        rel = _inside(folder, exc.filename)
        if rel is not None:
            where = f"{rel}:{exc.lineno}" if exc.lineno else rel
    if not where:
        for frame in reversed(traceback.extract_tb(exc.__traceback__)):
            rel = _inside(folder, frame.filename)
            if rel is not None:
                where = f"{rel}:{frame.lineno}" + (f" in {frame.name}" if frame.name != "<module>" else "")
                break
    text = _one_line(str(exc))
    return LoadError(message=f"{type(exc).__name__}: {text}" if text else type(exc).__name__, where=where)


def _inside(folder: Path, filename: str) -> str | None:
    """`filename` relative to the plugin folder, or None if it lies outside."""
    if not filename or filename.startswith("<"):
        return None
    try:
        return str(Path(filename).resolve().relative_to(folder.resolve()))
    except (ValueError, OSError):
        return None


def _one_line(text: str) -> str:
    return " ".join(text.split())
