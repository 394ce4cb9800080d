"""Probes the sandbox's walls from inside, for tests/test_sandbox_walls.py: reads
whatever paths it is told to (the checkout, the home, the state directory), fills
folders until the disk says no, and runs programs (a setuid-root binary)."""

from __future__ import annotations

import errno
import os
import subprocess
import time

from clawsup.sandbox.api import hookimpl


def walls_look(args: dict) -> dict:
    """For each path: whether it exists here, its entries or its first bytes."""
    out = {}
    for path in args["paths"]:
        seen: dict = {"exists": os.path.lexists(path)}
        try:
            if os.path.isdir(path):
                seen["entries"] = sorted(os.listdir(path))[:500]
            elif seen["exists"]:
                with open(path, "rb") as f:
                    seen["text"] = f.read(200).decode(errors="replace")
        except OSError as e:
            seen["error"] = f"{type(e).__name__}: {e.strerror}"
        out[path] = seen
    return out


def walls_fill(args: dict) -> dict:
    """Write files of `chunk_kb` into `dir` until `mb` are written or a write fails;
    `pause_ms` between files makes a slow, steady writer."""
    folder, total = args["dir"], int(args["mb"]) * 1024 * 1024
    chunk = b"\xa5" * (int(args.get("chunk_kb", 1024)) * 1024)
    pause = float(args.get("pause_ms", 0)) / 1000
    prefix = args.get("prefix", "fill")
    written, n, error = 0, 0, ""
    while written < total:
        try:
            with open(os.path.join(folder, f"{prefix}-{n}"), "wb") as f:
                f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            written += len(chunk)
        except OSError as e:
            error = errno.errorcode.get(e.errno or 0, str(e.errno))
            break
        n += 1
        if pause:
            time.sleep(pause)
    return {"written": written, "files": n, "error": error, "uid": os.getuid()}


def walls_run(args: dict) -> dict:
    r = subprocess.run(args["argv"], capture_output=True, text=True, timeout=20)
    return {"code": r.returncode, "stdout": r.stdout, "stderr": r.stderr}


@hookimpl
def clawsup_register(api) -> None:
    for fn in (walls_look, walls_fill, walls_run):
        api.register_tool(
            name=fn.__name__,
            description=(fn.__doc__ or fn.__name__).split("\n")[0],
            input_schema={"type": "object"},
            handler=fn,
        )
