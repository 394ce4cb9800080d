"""Who a sandbox's children run as: the `sandbox.runAs` policy.

`RunAs` is the setting, read: `auto` (the default), `supervisor`, or a user name or
uid. At start the gateway asks `choose_child_users` which users the process-backend
sandboxes can drop to (it probes: such a user must reach the runtime and the
plugins), then hands `RunAsPolicy.user_for` to the sandbox manager, which asks it
for every sandbox it launches, including the workspace sandboxes and subagent runs
made later. Per-sandbox uids come from `clawsup.sandbox.launch.uids`.

Never a silent step down to root: a user that cannot be dropped to is a refusal, and
untrusted code never runs as root. Supervisor-side code.
"""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from loguru import logger

from clawsup.sandbox.handshake import SandboxRole
from clawsup.sandbox.launch.launcher import Backend, ChildUser
from clawsup.sandbox.launch.uids import SandboxUids
from clawsup.supervisor.errors import ConfigError
from clawsup.supervisor.paths import StatePaths

RunAsMode = Literal["auto", "supervisor", "user"]


@dataclass(frozen=True)
class RunAs:
    """`sandbox.runAs`, read: a mode, and for `user` the name or uid as written."""

    mode: RunAsMode
    user: str = ""

    @classmethod
    def of(cls, setting: str) -> RunAs:
        if setting == "auto":
            return cls("auto")
        if setting == "supervisor":
            return cls("supervisor")
        return cls("user", setting)

    def __str__(self) -> str:
        return self.user if self.mode == "user" else self.mode


class Planned(Protocol):
    """What the policy reads of a sandbox's plan (supervisor/sandboxes/plans.py
    SandboxPlan)."""

    @property
    def sandbox_id(self) -> str: ...
    @property
    def backend(self) -> Backend: ...
    @property
    def role(self) -> SandboxRole: ...
    @property
    def trusted(self) -> bool: ...
    @property
    def plugin_dir(self) -> Path | None: ...


def named_user(setting: str) -> ChildUser:
    """`sandbox.runAs` as a user name or uid. Raises KeyError when there is none."""
    pw = pwd.getpwuid(int(setting)) if setting.isdigit() else pwd.getpwnam(setting)
    return ChildUser(pw.pw_name, pw.pw_uid, pw.pw_gid)


def child_users_for(
    run_as: RunAs,
    sandbox_ids: list[str],
    plugin_dirs: list[Path],
    reach: list[Path] | None = None,
    *,
    own_uids: Callable[[list[str]], dict[str, ChildUser]] | None = None,
) -> tuple[dict[str, ChildUser], str]:
    """Decide who each sandbox's children run as, from `sandbox.runAs`.

    `supervisor`: as the supervisor. A user name or uid: all as that user, or an
    error. `auto` (the default): when the supervisor is root, each sandbox as its
    own unprivileged uid (from `own_uids`, the gateway's `SandboxUids`), provided
    such a uid can run the host runtime and read the plugins; else as the
    supervisor.

    Returns (sandbox id -> user; empty for "as the supervisor", and a sentence for
    the operator when it is not what was asked or hoped for; empty otherwise).
    """
    if run_as.mode == "supervisor":
        return {}, ""
    if os.geteuid() != 0:
        if run_as.mode == "auto":
            return {}, ""
        return {}, f"sandbox.runAs {run_as.user!r} needs the supervisor to run as root"
    if run_as.mode == "auto":
        if own_uids is None:
            raise TypeError("child_users_for: a root supervisor's sandbox.runAs 'auto' needs own_uids")
        users = own_uids(sandbox_ids)
        who = "their own unprivileged uids"
    else:
        try:
            one = named_user(run_as.user)
        except (KeyError, ValueError):
            return {}, f"sandbox.runAs: no user {run_as.user!r} on this machine"
        users = {sid: one for sid in sandbox_ids}
        who = f"{one.name!r} (uid {one.uid})"
    if not users:
        return {}, ""
    problem = _probe_user(next(iter(users.values())), plugin_dirs, reach or [])
    if problem:
        return {}, f"children cannot run as {who}: {problem}"
    return users, ""


def choose_child_users(
    run_as: RunAs, paths: StatePaths, *, plans: Sequence[Planned], process_plans: Sequence[Planned], source: str, uids: SandboxUids
) -> tuple[dict[str, ChildUser], Path]:
    """Who each process-backend sandbox's children run as (see `child_users_for`),
    and where the children's sockets go. The probe runs as such a user against the
    very paths a child needs. `plans` are all of the gateway's sandboxes: a root
    supervisor's `auto` takes their own uids in one visit to the machine's record.
    Blocking (the record's lock, the probe): the gateway runs it in a thread."""
    if os.geteuid() == 0 and run_as.mode == "auto":
        uids.users([p.sandbox_id for p in plans])
    ids = [p.sandbox_id for p in process_plans]
    if os.geteuid() != 0 or run_as.mode == "supervisor":
        users, why = child_users_for(run_as, ids, [])
        if why:
            raise ConfigError(source, [why])
        return {}, paths.host_sockets()
    paths.open_path_for_children()
    sockets = paths.host_sockets(other_uid=True)
    plugin_dirs = sorted({p.plugin_dir for p in process_plans if p.plugin_dir is not None})
    users, why = child_users_for(run_as, ids, plugin_dirs, reach=[paths.sandboxes, sockets], own_uids=uids.users)
    if why:
        # Never a silent step down to root: a failed drop is a refusal.
        raise ConfigError(source, [
            f"sandbox.runAs: {why}. clawsup does not run them as root instead ({', '.join(ids)}). Install Python, clawsup "
            "and the plugins where other users can read them (not under a 0700 home), or use the bwrap backend (it binds "
            "them in), or set sandbox.runAs: \"supervisor\" to run this trusted code as root on purpose (untrusted code "
            "never runs as root)"
        ])  # fmt: skip
    if not users:
        for d in (paths.root, paths.sandboxes):
            os.chmod(d, 0o700)
        return {}, paths.host_sockets()
    names = ", ".join(f"{sid} as {u.name}" for sid, u in users.items())
    logger.info("sandbox children drop root: {}", names)
    return users, sockets


class RunAsPolicy:
    """Who a sandbox's children run as, asked by the sandbox manager for each launch
    (`user_for`; None: as the supervisor). Created by the gateway from the setting
    and what `choose_child_users` found; lives as long as the gateway.

    Process-backend plugins run as `choose_child_users` found workable. Under bwrap
    the runtime is bound into the sandbox with open parents, so a root supervisor's
    `auto` always gives such a sandbox its own uid (also the workspace sandboxes
    created later, one per agent or session). A root supervisor never runs a
    container as root, so docker gets its own uid under `supervisor` too; and
    `supervisor` is for trusted code: untrusted plugins, workspaces and subagent runs
    still get their own uid (as uid 0, even without capabilities, a child owns every
    root file it can see and can leave setuid-root binaries behind)."""

    def __init__(self, run_as: RunAs, process_users: dict[str, ChildUser], uids: SandboxUids) -> None:
        self.run_as = run_as
        self._process_users = process_users
        self._uids = uids

    def user_for(self, plan: Planned) -> ChildUser | None:
        run_as, process_users = self.run_as, self._process_users
        if plan.backend in ("bwrap", "docker"):
            if os.geteuid() != 0 or (run_as.mode == "supervisor" and plan.backend == "bwrap" and plan.trusted):
                return None
            if run_as.mode in ("auto", "supervisor"):
                return self._uids.user(plan.sandbox_id)
            return named_user(run_as.user)
        if plan.sandbox_id in process_users:
            return process_users[plan.sandbox_id]
        if plan.role in ("workspace", "subagent") and process_users and run_as.mode == "auto":
            # Own uids work here (the probe said so): one for each workspace sandbox
            # and subagent run.
            return self._uids.user(plan.sandbox_id)
        if plan.role in ("workspace", "subagent") and process_users:
            return next(iter(process_users.values()))
        return None


def _others_can_run(exe: Path) -> bool:
    """Whether a user who is neither owner nor in the group can reach and execute
    `exe`: o+x on every directory on the way, and on the file."""
    try:
        real = exe.resolve()
        for d in real.parents:
            if not os.stat(d).st_mode & stat.S_IXOTH:
                return False
        return bool(os.stat(real).st_mode & stat.S_IXOTH)
    except OSError:
        return False


def _probe_user(user: ChildUser, plugin_dirs: list[Path], reach: list[Path]) -> str:
    """Run the host runtime's imports as `user`, list each plugin folder and reach
    (stat) each of `reach`: what a child will need. Empty when it works, else what
    failed. About 0.1 s, once per start."""
    # It drops privileges with the host's own code, as a host does, so that Popen can
    # vfork (see sandbox/host/__main__.py). It has to start as root to drop, so the
    # interpreter's reachability by other users is checked from the permission bits.
    if not _others_can_run(Path(sys.executable)):
        return f"Permission denied: {sys.executable}"
    code = (
        "import sys, os\n"
        "from clawsup.sandbox.host.__main__ import _drop_privileges\n"
        f"_drop_privileges({user.uid}, {user.gid})\n"
        "import clawsup.sandbox.host.server\n"
        "n = int(sys.argv[1])\n"
        "for p in sys.argv[2:2 + n]: os.listdir(p)\n"
        "for p in sys.argv[2 + n:]: os.stat(p)"
    )
    try:
        r = subprocess.run(
            [sys.executable, "-I", "-c", code, str(len(plugin_dirs)), *map(str, plugin_dirs), *map(str, reach)],
            cwd="/", env={"PATH": os.environ.get("PATH", "")},
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as e:
        return str(e)
    if r.returncode != 0:
        return (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[-1]
    return ""
