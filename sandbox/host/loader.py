"""Loads one plugin folder inside the child, through pluggy."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy

from sandbox.api import PROJECT_NAME, PluginApi, PluginSpec


def import_entry(folder: Path, plugin_id: str, entry: str) -> ModuleType:
    # The plugin may import its sibling modules by name.
    sys.path.insert(0, str(folder))
    if entry.endswith(".py"):
        path = (folder / entry).resolve()
        if not path.is_relative_to(folder.resolve()):
            raise ImportError(f"entry {entry!r} points outside the plugin folder")
        name = f"clawsup_plugin_{plugin_id.replace('-', '_')}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load entry file {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    return importlib.import_module(entry)


def load_plugin(folder: Path, plugin_id: str, entry: str, config: dict[str, Any], workspace: Path) -> PluginApi:
    """Import the entry module and run its `clawsup_register`. Whatever it raises
    propagates: the host then exits before the handshake, with the traceback on
    stderr, which is where an author looks."""
    pm = pluggy.PluginManager(PROJECT_NAME)
    pm.add_hookspecs(PluginSpec)
    module = import_entry(folder, plugin_id, entry)
    pm.register(module, name=plugin_id)
    api = PluginApi(plugin_id=plugin_id, config=config, workspace=workspace)
    pm.hook.clawsup_register(api=api)
    return api
