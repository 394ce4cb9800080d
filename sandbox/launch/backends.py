"""Which launch backends work on this machine, and how to make their launchers: the
one place that knows the backends by name (the gateway, `clawsup exec run` and the
workspace settings ask here). The names are `Backend` (and `BackendChoice`, with
`auto`), defined beside the launcher interface. Supervisor-side code; docker's SDK
is imported only when docker is asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from clawsup.sandbox.launch.bwrap import BwrapLauncher, bwrap_problem
from clawsup.sandbox.launch.cgroup import CgroupRoot
from clawsup.sandbox.launch.launcher import Backend, BackendChoice, Launcher
from clawsup.sandbox.launch.process import ProcessLauncher, Warden

__all__ = ["ISOLATING", "Backend", "BackendChoice", "backend_named", "backend_problem", "first_isolating", "make_launcher"]

_BACKENDS: dict[str, Backend] = {"process": "process", "bwrap": "bwrap", "docker": "docker"}


def backend_named(name: str) -> Backend:
    """The backend a name from outside the config (a command-line flag) means;
    ValueError, naming the choices, for any other name."""
    if name not in _BACKENDS:
        raise ValueError(f"{name!r} is not a backend (process, bwrap or docker)")
    return _BACKENDS[name]


def backend_problem(name: Backend) -> str:
    """Empty when `name` can run sandboxes here, else why not."""
    if name == "bwrap":
        return bwrap_problem()
    if name == "docker":
        from clawsup.sandbox.launch.container import docker_problem

        return docker_problem()
    return ""


ISOLATING: tuple[Backend, ...] = ("bwrap", "docker")
"""The backends that contain untrusted code, in the order `auto` tries them."""


def first_isolating(problem_of: Callable[[Backend], str] = backend_problem) -> tuple[Backend | None, str]:
    """What `auto` means: the first isolating backend that works here, else None and
    why none does (`bwrap: ...; docker: ...`)."""
    reasons = []
    for b in ISOLATING:
        problem = problem_of(b)
        if not problem:
            return b, ""
        reasons.append(f"{b}: {problem}")
    return None, "; ".join(reasons)


def make_launcher(name: Backend, *, cgroups: CgroupRoot | None, state_dir: Path, warden: Warden | None = None) -> Launcher:
    if name == "bwrap":
        return BwrapLauncher(cgroups, warden)
    if name == "docker":
        from clawsup.sandbox.launch.container import DockerLauncher

        return DockerLauncher(state_dir, warden)
    return ProcessLauncher(cgroups, warden)
