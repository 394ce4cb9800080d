"""The file tools (`read`, `write`, `edit`, `list_dir`), run inside a workspace
sandbox host and confined to its workspace by real path.

Every path is opened first and checked after: the kernel's answer for the open file
descriptor (`/proc/self/fd/N`) must lie inside the workspace. A symlink swapped in
between a check and a use therefore cannot take us outside, because the use is the
descriptor that was checked. New files and folders are created relative to an
already checked directory descriptor, never through a symlink (`O_NOFOLLOW`,
`O_EXCL`), so a dangling link cannot make us create a file outside either.

The sandbox (bwrap's mount namespace, the child's own uid) is the wall behind this;
these checks keep a model's honest mistakes, and a workspace's own symlinks, from
reaching what the sandbox still shows (the system directories, the interpreter).

Protected paths (`.git/hooks`, `.git/config`, rc files: what makes the host run
code later; sandbox/protected.py) may be read but not written or edited: by their
name, by a symlink leading to them, or by creating the file that would stand where
one of their folders belongs (a `.git` gitfile). On bwrap and docker they are also
read-only mounts; on the process backend this refusal is all there is.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from typing import Any, overload

from clawsup.sandbox.api import PluginApi, ToolError
from clawsup.sandbox.protected import normalize

MAX_EDIT_BYTES = 8 * 1024 * 1024
READ_SKIP = 1024 * 1024
MAX_LIST_ENTRIES = 1000
_OPEN_CHECK = os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
"""Opening a FIFO or a device for the check must neither block nor take a tty."""


class Workspace:
    def __init__(self, root: str, *, read_max_bytes: int, protected: list[str] | tuple[str, ...] = ()) -> None:
        self.root = os.path.realpath(root)
        self.read_max_bytes = read_max_bytes
        self.protected = tuple(n for p in protected if (n := normalize(p)) is not None)

    # --- confinement -----------------------------------------------------------

    def _lexical(self, path: str) -> str:
        if not isinstance(path, str) or not path:
            raise ToolError("path must be a non-empty string")
        if "\0" in path:
            raise ToolError("path must not contain NUL")
        full = os.path.normpath(os.path.join(self.root, path))
        if not self._inside(full):
            raise ToolError(f"{path!r} is outside the workspace")
        return full

    def _inside(self, real: str) -> bool:
        return real == self.root or real.startswith(self.root + os.sep)

    def _refuse_protected(self, full: str, path: str) -> None:
        """Refuse to write `full` (an absolute path in the workspace, lexical or real)
        if it is a protected path, lies under one, or would stand where a protected
        path's folder belongs."""
        if not self._inside(full) or full == self.root:
            return
        rel = full[len(self.root) + 1 :]
        for p in self.protected:
            if rel == p or rel.startswith(p + "/") or p.startswith(rel + "/"):
                raise ToolError(
                    f"{path!r} is protected ({p!r}): the host may run it later (git hooks and config, shell rc files), "
                    "so the sandbox may read it but not change it. The operator sets these in sandbox.protectedPaths"
                )

    def _refuse_protected_fd(self, fd: int, path: str) -> None:
        real = os.readlink(f"/proc/self/fd/{fd}")
        try:
            self._refuse_protected(real, path)
        except ToolError:
            os.close(fd)
            raise

    def _verify(self, fd: int, path: str) -> None:
        real = os.readlink(f"/proc/self/fd/{fd}")
        if not self._inside(real):
            os.close(fd)
            raise ToolError(f"{path!r} leads outside the workspace (through a symlink)")

    def _reopen(self, fd: int, flags: int) -> int:
        """The checked O_PATH descriptor's very inode, opened for real use."""
        try:
            return os.open(f"/proc/self/fd/{fd}", flags | _OPEN_CHECK)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _open(self, path: str, flags: int) -> Iterator[int]:
        full = self._lexical(path)
        try:
            # O_PATH first: checking needs no permission and has no side effect;
            # only a descriptor found inside is then opened for reading or writing.
            fd = os.open(full, os.O_PATH | os.O_CLOEXEC | (flags & os.O_DIRECTORY))
            self._verify(fd, path)
            if flags & (os.O_WRONLY | os.O_RDWR):
                self._refuse_protected_fd(fd, path)
            fd = self._reopen(fd, flags)
        except FileNotFoundError:
            raise ToolError(f"{path!r} does not exist") from None
        except IsADirectoryError:
            raise ToolError(f"{path!r} is a directory") from None
        except NotADirectoryError:
            raise ToolError(f"{path!r}: a part of it is not a directory") from None
        except PermissionError:
            raise ToolError(f"{path!r}: permission denied") from None
        try:
            yield fd
        finally:
            os.close(fd)

    def _regular(self, fd: int, path: str) -> os.stat_result:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ToolError(f"{path!r} is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise ToolError(f"{path!r} is not a regular file")
        os.set_blocking(fd, True)
        return st

    def _parent_fd(self, full: str, path: str) -> tuple[int, str]:
        """A checked descriptor of `full`'s parent, creating the missing folders
        under the nearest existing one; and `full`'s last component."""
        parent, name = os.path.split(full)
        if not name:
            raise ToolError(f"{path!r} names the workspace itself")
        missing: list[str] = []
        head = parent
        while not os.path.lexists(head):
            head, part = os.path.split(head)
            missing.insert(0, part)
        try:
            fd = os.open(head, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except NotADirectoryError:
            raise ToolError(f"{path!r}: {os.path.relpath(head, self.root)!r} is not a directory") from None
        except FileNotFoundError:
            raise ToolError(f"{path!r}: {os.path.relpath(head, self.root)!r} is a dangling symlink") from None
        self._verify(fd, path)
        try:
            self._refuse_protected(os.path.join(os.readlink(f"/proc/self/fd/{fd}"), *missing, name), path)
        except ToolError:
            os.close(fd)
            raise
        try:
            for part in missing:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                # O_NOFOLLOW: if someone put a symlink there meanwhile, we stop.
                nfd = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = nfd
        except OSError as e:
            os.close(fd)
            raise ToolError(f"{path!r}: cannot create its folder: {e.strerror}") from None
        return fd, name

    def _open_for_write(self, path: str) -> tuple[int, bool]:
        """(descriptor open for writing, whether it was created)."""
        full = self._lexical(path)
        self._refuse_protected(full, path)
        dfd, name = self._parent_fd(full, path)
        try:
            try:
                fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | _OPEN_CHECK, dir_fd=dfd)
                created = False
            except FileNotFoundError:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
                created = True
            except OSError as e:
                if e.errno != 40:  # ELOOP: the last component is a symlink
                    raise
                try:
                    fd = os.open(name, os.O_PATH | os.O_CLOEXEC, dir_fd=dfd)
                except FileNotFoundError:
                    raise ToolError(f"{path!r} is a symlink to a missing file; not following it") from None
                self._verify(fd, path)
                self._refuse_protected_fd(fd, path)
                fd = self._reopen(fd, os.O_WRONLY)
                created = False
        except IsADirectoryError:
            raise ToolError(f"{path!r} is a directory") from None
        except PermissionError:
            raise ToolError(f"{path!r}: permission denied") from None
        finally:
            os.close(dfd)
        self._verify(fd, path)
        try:
            self._regular(fd, path)
        except BaseException:
            os.close(fd)
            raise
        return fd, created

    def directory(self, path: str) -> str:
        """The real path of a folder inside the workspace (exec's workdir)."""
        with self._open(path, os.O_RDONLY | os.O_DIRECTORY) as fd:
            return os.readlink(f"/proc/self/fd/{fd}")

    # --- the tools --------------------------------------------------------------

    def read(self, args: dict[str, Any]) -> str:
        offset = _int(args, "offset", 1, minimum=1)
        limit = _int(args, "limit", None, minimum=1)
        path = _path(args)
        with self._open(path, os.O_RDONLY) as fd:
            self._regular(fd, path)
            out: list[bytes] = []
            size = shown = lineno = 0
            more = ""
            cap = self.read_max_bytes
            with os.fdopen(os.dup(fd), "rb") as f:
                # readline with a size: memory stays bounded by the cap even for a
                # file that is one enormous line.
                while piece := f.readline(cap + 1):
                    lineno += 1
                    if lineno < offset:
                        if len(piece) > cap and not piece.endswith(b"\n"):  # the rest of a long line
                            while (piece := f.readline(READ_SKIP)) and not piece.endswith(b"\n"):
                                pass
                        continue
                    if limit is not None and shown >= limit:
                        more = f"[more lines follow; continue with offset={lineno}]"
                        break
                    if size + len(piece) > cap:
                        if shown == 0:
                            out.append(piece[:cap])
                            more = f"[line {lineno} cut at {cap} bytes]"
                        else:
                            more = f"[output cap of {cap} bytes reached; continue with offset={lineno}]"
                        break
                    out.append(piece)
                    size += len(piece)
                    shown += 1
        text = b"".join(out).decode("utf-8", errors="replace")
        if more:
            text += ("" if text.endswith("\n") or not text else "\n") + more
        return text

    def write(self, args: dict[str, Any]) -> str:
        content = args.get("content")
        if not isinstance(content, str):
            raise ToolError("content must be a string")
        data = content.encode()
        path = _path(args)
        fd, created = self._open_for_write(path)
        try:
            os.ftruncate(fd, 0)
            _write_all(fd, data)
        finally:
            os.close(fd)
        return f"{'created' if created else 'wrote'} {path} ({len(data)} bytes)"

    def edit(self, args: dict[str, Any]) -> str:
        old, new = args.get("old_string"), args.get("new_string")
        if not isinstance(old, str) or not old:
            raise ToolError("old_string must be a non-empty string")
        if not isinstance(new, str):
            raise ToolError("new_string must be a string")
        path = _path(args)
        with self._open(path, os.O_RDWR) as fd:
            st = self._regular(fd, path)
            if st.st_size > MAX_EDIT_BYTES:
                raise ToolError(f"{path!r} is {st.st_size} bytes; edit handles files up to {MAX_EDIT_BYTES}")
            raw = os.pread(fd, st.st_size + 1, 0)
            try:
                text = raw.decode()
            except UnicodeDecodeError:
                raise ToolError(f"{path!r} is not UTF-8 text") from None
            count = text.count(old)
            if count == 0:
                raise ToolError(f"old_string was not found in {path!r}; nothing changed")
            if count > 1:
                raise ToolError(
                    f"old_string occurs {count} times in {path!r}; refusing to guess which one. "
                    "Include more surrounding text so that it matches exactly once"
                )
            data = text.replace(old, new, 1).encode()
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            _write_all(fd, data)
        return f"edited {path}: replaced 1 occurrence"

    def list_dir(self, args: dict[str, Any]) -> list[dict[str, Any]] | dict[str, Any]:
        path = _path(args, default=".")
        with self._open(path, os.O_RDONLY | os.O_DIRECTORY) as fd:
            entries = []
            with os.scandir(fd) as it:
                for e in it:
                    entries.append(e)
            entries.sort(key=lambda e: e.name)
            out = []
            for e in entries[:MAX_LIST_ENTRIES]:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                kind = "dir" if stat.S_ISDIR(st.st_mode) else "symlink" if stat.S_ISLNK(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
                item: dict[str, Any] = {"name": e.name, "type": kind}
                if kind == "file":
                    item["size"] = st.st_size
                out.append(item)
        if len(entries) > MAX_LIST_ENTRIES:
            return {"entries": out, "truncated": True, "total": len(entries)}
        return out

    def register(self, api: PluginApi) -> None:
        for name, handler, description, schema in (
            ("read", self.read, READ_DESCRIPTION, READ_SCHEMA),
            ("write", self.write, WRITE_DESCRIPTION, WRITE_SCHEMA),
            ("edit", self.edit, EDIT_DESCRIPTION, EDIT_SCHEMA),
            ("list_dir", self.list_dir, LIST_DESCRIPTION, LIST_SCHEMA),
        ):
            api.register_tool(name=name, description=description, input_schema=schema, handler=handler)


def _path(args: dict[str, Any], *, default: str | None = None) -> str:
    path = args.get("path", default)
    if not isinstance(path, str) or not path:
        raise ToolError("path must be a non-empty string")
    return path


@overload
def _int(args: dict[str, Any], key: str, default: int, *, minimum: int) -> int: ...
@overload
def _int(args: dict[str, Any], key: str, default: None, *, minimum: int) -> int | None: ...
def _int(args: dict[str, Any], key: str, default: int | None, *, minimum: int) -> int | None:
    """`args[key]`, an integer of at least `minimum`; `default` when it is missing
    or null (the core tools' schemas allow null for "not given")."""
    v = args.get(key)
    if v is None:
        return default
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise ToolError(f"{key} must be an integer >= {minimum}")
    return v


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


_PATH = {"type": "string", "description": "A path inside the workspace, relative to it (or absolute within it)."}
READ_DESCRIPTION = "Read a text file of the workspace. Long files: pass offset (first line, 1-based) and limit (lines)."
READ_SCHEMA = {
    "type": "object",
    "properties": {"path": _PATH, "offset": {"type": "integer", "minimum": 1}, "limit": {"type": "integer", "minimum": 1}},
    "required": ["path"],
    "additionalProperties": False,
}
WRITE_DESCRIPTION = "Create or overwrite a file in the workspace; missing parent folders are created."
WRITE_SCHEMA = {
    "type": "object",
    "properties": {"path": _PATH, "content": {"type": "string"}},
    "required": ["path", "content"],
    "additionalProperties": False,
}
EDIT_DESCRIPTION = "Replace one exact, unique occurrence of old_string with new_string in a workspace file."
EDIT_SCHEMA = {
    "type": "object",
    "properties": {"path": _PATH, "old_string": {"type": "string", "minLength": 1}, "new_string": {"type": "string"}},
    "required": ["path", "old_string", "new_string"],
    "additionalProperties": False,
}
LIST_DESCRIPTION = "List a folder of the workspace: names, types, and sizes of files."
LIST_SCHEMA = {
    "type": "object",
    "properties": {"path": {**_PATH, "default": "."}},
    "additionalProperties": False,
}
