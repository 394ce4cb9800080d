"""Plants, from inside its sandbox, what the supervisor must never follow or block
on: symlinks and FIFOs in the folder of its own gRPC socket (which the sandbox can
write). It runs at registration, so every start plants again for the next one."""

import os

from clawsup.sandbox.api import hookimpl


def _socket_dir() -> str:
    with open("/proc/self/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    return os.path.dirname(argv[argv.index(b"--socket") + 1].decode())


def _replace(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _plant(cfg: dict) -> list[str]:
    d = _socket_dir()
    planted = []
    for name, target in cfg.get("symlinks", {}).items():
        path = os.path.join(d, name)
        _replace(path)
        os.symlink(target, path)
        planted.append(f"{path} -> {target}")
    for name in cfg.get("fifos", []):
        path = os.path.join(d, name)
        _replace(path)
        os.mkfifo(path, 0o666)
        planted.append(f"{path} (fifo)")
    return planted


def _flood(args: dict) -> str:
    total = int(args.get("mb", 200)) * 1024 * 1024
    chunk = b"squatter flood " * 4096
    written = 0
    while written < total:
        written += os.write(1, chunk[: total - written])
    return f"wrote {written} bytes"


@hookimpl
def clawsup_register(api) -> None:
    planted = _plant(api.config)
    api.register_tool(name="squatter_planted", description="What was planted at this start.", handler=lambda args: planted)
    api.register_tool(name="squatter_flood", description="Write `mb` MiB to stdout.", handler=_flood)
