"""Entry point of a sandbox child: `python -m clawsup.sandbox.host --plugin-dir DIR ...`.

The order matters and is why this file imports so little at the top:
1. tie our life to the supervisor's (PR_SET_PDEATHSIG), then re-check the parent,
   because it may have died between our fork and the prctl; set no_new_privs;
2. block on the start gate until the supervisor has applied cgroup and rlimits;
3. set our own rlimits, and drop to the uid the supervisor chose (then set the death
   signal again: the kernel clears it when credentials change);
4. only then import grpc and the plugin.

The child drops its own privileges rather than having Popen do it: Popen can only
change uid by fork() (not vfork()), and a fork() of the multithreaded, grpc-laden
supervisor ran grpc's at-fork handlers in the child, which now and then segfaulted
before exec (tests/test_privileges.py caught it).
"""

from __future__ import annotations

import argparse
import os
import sys


def _die_with_parent(parent_pid: int) -> None:
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:
        # The supervisor died before the prctl took effect; nobody would kill us.
        os._exit(70)


def _no_new_privs() -> None:
    """From here on no exec can gain privileges: a setuid-root binary the sandbox
    reaches runs with our uid (tests/test_sandbox_walls.py). bwrap and docker set it
    too; this is what holds it on the process backend. Inherited by every command the
    host runs, and kept across the uid drop."""
    import ctypes

    PR_SET_NO_NEW_PRIVS = 38
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        print(f"clawsup host: prctl(PR_SET_NO_NEW_PRIVS) failed (errno {ctypes.get_errno()}); refusing to run", file=sys.stderr)
        os._exit(66)


def _read_gate(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _read_gate_file(path: str) -> bytes:
    """The supervisor writes the file whole before the container starts and mounts it
    read-only; it removes the file itself once the child is gone (sandbox/launch/container.py)."""
    with open(path, "rb") as f:
        return f.read()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m clawsup.sandbox.host",
        description=(
            "A clawsup sandbox host. It is started by the clawsup supervisor, which hands it "
            "its secrets on the start gate; running it by hand does nothing useful. "
            "Use `clawsup start --plugin DIR` to run a plugin."
        ),
    )
    p.add_argument("--plugin-dir", default="", help="empty for a workspace host")
    p.add_argument("--socket", required=True)
    p.add_argument("--gate-fd", type=int, help="read the start gate from this fd")
    p.add_argument("--gate-file", help="... or from this read-only file (containers: no fd crosses into them)")
    p.add_argument("--parent-pid", type=int, required=True)
    p.add_argument("--workdir", help="chdir here once privileges are dropped (bwrap: the workspace is the child's own, 0700)")
    args = p.parse_args(argv)

    _die_with_parent(args.parent_pid)
    _no_new_privs()
    try:
        if args.gate_file:
            raw = _read_gate_file(args.gate_file)
        else:
            raw = _read_gate(args.gate_fd)
    except OSError as e:
        print(f"clawsup host: cannot read the start gate ({args.gate_file or f'fd {args.gate_fd}'}): {e}", file=sys.stderr)
        os._exit(64)
    if not raw:
        # The supervisor closed the gate without opening it: it decided not to run us.
        os._exit(0)

    from clawsup.sandbox.handshake import GatePayload

    gate = GatePayload.decode(raw)
    _limit_self(gate.rlimits)
    if gate.run_as is not None:
        _drop_privileges(*gate.run_as)
        _die_with_parent(args.parent_pid)
    if args.workdir:
        os.chdir(args.workdir)

    from clawsup.sandbox.host.server import run

    run(plugin_dir=args.plugin_dir, socket_path=args.socket, gate=gate)


def _drop_privileges(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or os.getgroups():
        print(f"clawsup host: could not drop to uid {uid}, gid {gid}; refusing to run", file=sys.stderr)
        os._exit(65)


def _limit_self(rlimits: dict[str, int]) -> None:
    import resource

    for name, value in rlimits.items():
        which = getattr(resource, name)
        _, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))


if __name__ == "__main__":
    main()
