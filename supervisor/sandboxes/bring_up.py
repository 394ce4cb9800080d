"""The bring-up of one incarnation: what its child is launched with (its folders,
environment, fresh tokens and gate), then the handshake, the dial, the health check
and the Describe that must pass before it may serve. Which described tools it may
hold is supervisor/sandboxes/registrations.py's; every state transition is the
driver's (supervisor/sandboxes/supervised.py).
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from pathlib import Path

from clawsup.sandbox.handshake import GatePayload, HandshakeError
from clawsup.sandbox.launch.launcher import Child, ChildUser, LaunchSpec, Launcher
from clawsup.sandbox.socket_paths import UnsafeSocket, dial_address, open_child_socket
from clawsup.supervisor.paths import child_dir, own_dir, workspace_tmp
from clawsup.supervisor.sandboxes.host_client import CallAborted, Description, HostClient, HostMisbehaved, HostUnreachable
from clawsup.supervisor.sandboxes.incarnation import Incarnation, Timing
from clawsup.supervisor.sandboxes.log import SandboxLog
from clawsup.supervisor.sandboxes.plans import SandboxPlan
from clawsup.supervisor.sandboxes.registry import Kind, Registry

DESCRIBE_TIMEOUT_S = 5.0


@dataclass(frozen=True, kw_only=True)
class SandboxDirs:
    workspace: Path
    """The child's cwd and HOME: `<state>/sandboxes/<id>/workspace`."""
    run_dir: Path
    """The 0700 directory of the child's socket."""
    operator_workspace: bool = False
    """The workspace is a folder the operator named: not chmodded, no .tmp in it."""
    private: Path | None = None
    """`<state>/sandboxes/<id>/private`: written by the supervisor only (see
    LaunchSpec.private_dir)."""


class LaunchFailed(Exception):
    """The launcher could not start the child (it cleaned up after itself)."""


class BringUp:
    """Launches and brings up each incarnation of one sandbox. Created with its
    SupervisedSandbox and owned by it; holds the tokens of the current incarnation,
    fresh for each child, so a token that leaked from a dead child opens nothing."""

    def __init__(
        self,
        plan: SandboxPlan,
        *,
        launcher: Launcher,
        registry: Registry,
        timing: Timing,
        dirs: SandboxDirs,
        log: SandboxLog,
        env: dict[str, str],
        run_as: ChildUser | None,
    ) -> None:
        self._plan = plan
        self._launcher = launcher
        self._registry = registry
        self._timing = timing
        self._dirs = dirs
        self._log = log
        self._env = env
        self._run_as = run_as
        self._tokens = ("", "")
        """(supervisor token, host token) of the current incarnation."""

    async def launch(self) -> Child:
        try:
            return await self._launch_child()
        except Exception as e:
            raise LaunchFailed(str(e)) from e

    async def _launch_child(self) -> Child:
        plan, dirs, workspace = self._plan, self._dirs, self._dirs.workspace
        env = dict(self._env)
        if dirs.operator_workspace:
            # The operator's own folder (`clawsup exec run --workspace`): used as is.
            env.update(HOME=str(workspace))
        else:
            # The sandbox's folder is ours (enter-only: a child running as another
            # user reaches its workspace by name); the workspace is the child's, and
            # what is in it is touched by descriptor only (supervisor/paths.py).
            own_dir(workspace.parent, 0o711)
            child_dir(workspace, 0o700)
            env.update(HOME=str(workspace))
            tmp, notes = workspace_tmp(workspace)
            for note in notes:
                self._log.event(note)
            if tmp is not None:
                env.update(TMPDIR=str(tmp))
        child_dir(dirs.run_dir, 0o700)
        supervisor_token, host_token = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        self._tokens = (supervisor_token, host_token)
        spec = LaunchSpec(
            sandbox_id=plan.sandbox_id,
            plugin_dir=plan.plugin_dir,
            workspace=workspace,
            run_dir=dirs.run_dir,
            run_as=self._run_as,
            limits=plan.limits,
            env=env,
            network=plan.network,
            trusted=plan.trusted,
            protected_paths=plan.protected_paths,
            operator_workspace=dirs.operator_workspace,
            visible_paths=plan.visible_paths,
            private_dir=self._private_dir(),
            gate=GatePayload(
                sandbox_id=plan.sandbox_id,
                supervisor_token=supervisor_token,
                host_token=host_token,
                plugin_id=plan.plugin_id,
                plugin_version=plan.plugin_version,
                entry=plan.entry,
                plugin_config=plan.plugin_config,
                role=plan.role,
                tools=self._registry.claimable(plan.plugin_id, Kind.TOOL, plan.declared_tools) if plan.role == "plugin" else None,
                workspace_tools=plan.workspace_tools,
                mcp=plan.mcp,
            ),
        )
        return await self._launcher.launch(spec)

    def _private_dir(self) -> Path | None:
        d = self._dirs.private
        if d is None:
            return None
        own_dir(d.parent, 0o711)
        own_dir(d, 0o711)
        return d

    async def connect(self, inc: Incarnation) -> Description | None:
        """Handshake, dial, health, Describe: what the host serves, or None when a
        step failed and the child is being killed (its kill reason says which)."""
        t = self._timing
        try:
            async with asyncio.timeout(t.handshake_timeout_s):
                hs = await inc.output.handshake
        except TimeoutError:
            inc.kill(f"no handshake within {t.handshake_timeout_s:g} s", polite=False)
            return None
        except HandshakeError as e:
            inc.kill(f"bad handshake: {e}", polite=False)
            return None
        # Dial the socket we assigned, never an address the child names: plugin code
        # runs before the handshake and may print anything, including another
        # sandbox's socket. (The handshake's address matters only as a sanity check.)
        if hs.address != inc.child.socket_path:
            self._log.event(f"handshake names {hs.address}, dialling the assigned {inc.child.socket_path}")
        # The socket's folder is the child's to write: the name is opened once,
        # without following or blocking, checked, and dialled by descriptor, so that
        # no later swap of the name (a symlink to a listener of the plugin's own, that
        # would get the tokens) changes where a reconnect goes.
        try:
            inc.dial_fd = open_child_socket(inc.child.socket_path)
        except (UnsafeSocket, OSError) as e:
            inc.kill(f"refusing to dial the child's socket: {e}", polite=False)
            return None
        inc.client = HostClient(dial_address(inc.dial_fd), *self._tokens)
        try:
            if not await inc.client.health(timeout=t.handshake_timeout_s):
                inc.kill("health check did not say SERVING after the handshake", polite=False)
                return None
            desc = await inc.client.describe(DESCRIBE_TIMEOUT_S)
        except (HostUnreachable, HostMisbehaved, CallAborted) as e:
            inc.kill(f"bring-up failed: {e}", polite=False)
            return None
        if desc.plugin_id != self._plan.plugin_id:
            inc.kill(f"host serves plugin {desc.plugin_id!r}, expected {self._plan.plugin_id!r}", polite=False)
            return None
        return desc
