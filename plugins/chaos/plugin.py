"""Tools that misbehave on request. Each one acts out a fault the supervisor must
contain: the tests call them through the real supervisor, and operators can too
(`clawsup start --plugin plugins/chaos`, then `clawsup tools call chaos_crash`)."""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from clawsup.sandbox.api import hookimpl


def _crash(how: str, code: int) -> None:
    sys.stderr.write(f"chaos: crashing now ({how})\n")
    sys.stderr.flush()
    if how == "abort":
        os.abort()
    elif how == "segfault":
        ctypes.string_at(0)
    elif how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(code)


def chaos_crash(args: dict) -> str:
    """Crash: abort (SIGABRT), segfault (SIGSEGV), kill (SIGKILL) or exit with a code.
    With delay_ms > 0 it answers first and crashes later, while idle."""
    how = args.get("how", "segfault")
    code = int(args.get("code", 17))
    delay = float(args.get("delay_ms", 0)) / 1000
    if delay > 0:
        threading.Timer(delay, _crash, (how, code)).start()
        return f"will crash ({how}) in {delay:g} s"
    _crash(how, code)
    return "unreachable"


def chaos_raise(args: dict) -> str:
    raise RuntimeError(args.get("message", "chaos asked for an exception"))


def chaos_spin(args: dict) -> str:
    """Loops forever in a worker thread: cannot be interrupted."""
    x = 0
    while True:
        x += 1


async def chaos_hang(args: dict) -> str:
    """Blocks the host's event loop: the child stops answering anything, health
    checks included. With delay_ms > 0 it answers first and hangs later, while idle."""
    delay = float(args.get("delay_ms", 0)) / 1000
    if delay > 0:
        asyncio.get_running_loop().call_later(delay, _block_loop)
        return f"will hang in {delay:g} s"
    _block_loop()
    return "unreachable"


def _block_loop() -> None:
    print("chaos: blocking the event loop", file=sys.stderr, flush=True)
    time.sleep(10**6)


async def chaos_sleep(args: dict) -> str:
    await asyncio.sleep(float(args.get("seconds", 1)))
    return "slept"


def chaos_alloc(args: dict) -> str:
    """Allocate (and touch) memory until something stops us."""
    step = int(args.get("mb_per_step", 16)) * 1024 * 1024
    hoard = []
    while True:
        hoard.append(b"x" * step)


def chaos_forkbomb(args: dict) -> str:
    """Fork without end. Every child forks too. Only a cgroup or a namespace stops
    this as root; the supervisor refuses to be the only thing in the way."""
    while True:
        try:
            if os.fork() == 0:
                while True:
                    try:
                        os.fork()
                    except OSError:
                        time.sleep(0.01)
        except OSError:
            time.sleep(0.01)


def chaos_flood(args: dict) -> str:
    """Write `mb` MiB to stdout and/or stderr, with or without newlines."""
    total = int(float(args.get("mb", 50)) * 1024 * 1024)
    streams = {"stdout": [1], "stderr": [2], "both": [1, 2]}[args.get("stream", "both")]
    chunk = (b"flood " * 10 + b"\n") * 1000 if args.get("newlines", True) else b"x" * 65536
    written = 0
    while written < total:
        for fd in streams:
            os.write(fd, chunk)
        written += len(chunk)
    return f"wrote {written} bytes to {args.get('stream', 'both')}"


async def chaos_ignore_sigterm(args: dict) -> str:
    # Runs on the host's main thread (async handler), where signal.signal works.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return "SIGTERM is now ignored"


def chaos_spawn(args: dict) -> dict:
    """Start a grandchild (`sleep`) that does not exit by itself. With setsid it
    leaves our process group, so only a cgroup can still find it."""
    p = subprocess.Popen(
        ["sleep", str(args.get("seconds", 3600))],
        start_new_session=bool(args.get("setsid", False)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return {"pid": p.pid}


def chaos_write(args: dict) -> str:
    """Write `mb` MiB to a file in the workspace (to meet the file size limit)."""
    path = Path(args.get("name", "big.bin"))
    with open(path, "wb") as f:
        for _ in range(int(args.get("mb", 10))):
            f.write(b"\0" * (1024 * 1024))
    return f"wrote {path.stat().st_size} bytes"


def chaos_ok(args: dict) -> dict:
    if args.get("say"):
        print(args["say"])  # no flush: the host must not buffer a plugin's stdout
    return {"pid": os.getpid(), "ok": True}


def _attempt(op: str, path: str) -> str:
    import socket

    try:
        if op == "read":
            with open(path, "rb") as f:
                f.read(1)
        elif op == "write":
            with open(path, "ab") as f:
                f.write(b"x")
        elif op == "connect":
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(path)
        elif op == "kill":
            os.kill(int(path), 0)
        return "ok"
    except (OSError, ValueError) as e:
        return f"{type(e).__name__}: {e.strerror if isinstance(e, OSError) else e}"


def chaos_probe(args: dict) -> dict:
    """What the sandbox looks like from inside: ids, cwd, environment, limits. With
    `attempt: [[op, path], ...]` (op: read, write, connect, kill) it also tries each."""
    import resource

    limits = {
        name: resource.getrlimit(getattr(resource, name))[0]
        for name in ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_NOFILE", "RLIMIT_FSIZE", "RLIMIT_CORE", "RLIMIT_NPROC")
    }
    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "pgid": os.getpgid(0),
        "sid": os.getsid(0),
        "uid": os.getuid(),
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "limits": limits,
        "stdin": os.readlink("/proc/self/fd/0"),
        "cgroup": open("/proc/self/cgroup").read(),
        "attempts": [_attempt(op, path) for op, path in args.get("attempt", [])],
    }


@hookimpl
def clawsup_register(api) -> None:
    cfg = api.config
    marker = cfg.get("crashOnStartIfExists")
    if marker and Path(marker).exists():
        print(f"chaos: {marker} exists, exiting during registration", file=sys.stderr, flush=True)
        os._exit(9)
    on_register = cfg.get("onRegister", "none")
    if on_register == "exit":
        print("chaos: exiting during registration", file=sys.stderr, flush=True)
        sys.exit(5)
    if on_register == "crash":
        _crash("segfault", 0)
    if on_register == "hang":
        print("chaos: hanging during registration", file=sys.stderr, flush=True)
        time.sleep(10**6)
    if on_register == "junk_stdout":
        print("hello from chaos, this is not a handshake")
        print("CLAWSUP is a word I like")
        # No newline: the host's handshake line will follow on the same line.
        sys.stdout.write("unterminated ")

    async def chaos_ask(args: dict) -> dict:
        """Ask the supervisor for `method` over the child's stream."""
        try:
            return {"ok": True, "reply": await api.request(args.get("method", "log"), args.get("payload", {}))}
        except Exception as e:
            return {"ok": False, "error": f"{type(e).__name__}: {e}"}

    for fn in (chaos_ok, chaos_probe, chaos_write, chaos_crash, chaos_raise, chaos_spin, chaos_hang, chaos_sleep, chaos_alloc,
               chaos_forkbomb, chaos_flood, chaos_ignore_sigterm, chaos_spawn, chaos_ask):  # fmt: skip
        api.register_tool(name=fn.__name__, description=(fn.__doc__ or fn.__name__).strip().splitlines()[0], handler=fn)
    if on_register == "undeclared_tool":
        api.register_tool(name="chaos_undeclared", description="Not in the manifest.", handler=chaos_ok)
