"""The heartbeat: every `automation.heartbeat.every`, read `HEARTBEAT.md` in the
agent's workspace and run a turn only if its "Active tasks" section lists something.
The turn is told the tasks (its message) and what a heartbeat is (its system
prompt); a reply that is only `HEARTBEAT_OK` means there is nothing to tell, and the
beat stays silent. Every beat is recorded, whether it ran a turn or not.

It is a system job of the scheduler (id `heartbeat`): listed with the others, under
the same overlap and timeout rules, configured only in `clawsup.json`.

`HEARTBEAT.md` lives where the agent's own commands write, so it is read as hostile:
not through a symlink (a planted one would have the supervisor read any file it can
and hand it to the model), only a regular file, at most `MAX_BYTES`.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

from clawsup.supervisor.automation.jobs import HEARTBEAT_ID, Job
from clawsup.supervisor.automation.schedule import make_schedule
from clawsup.supervisor.config import HeartbeatConfig

FILE = "HEARTBEAT.md"
MAX_BYTES = 64 * 1024
ACK = "HEARTBEAT_OK"
ACK_MAX_CHARS = 300
"""A reply that starts or ends with the token and says at most this much more is an
acknowledgement, not news."""
INSTRUCTIONS = (
    "This turn is a heartbeat: a periodic check, not a message from anyone. The user message lists the active tasks "
    f"from {FILE}. Do what they ask. If nothing needs the user's attention, reply with exactly {ACK} and nothing else; "
    "otherwise reply with what they should know."
)
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+(?:\[( |x|X)\]\s+)?(.*\S)\s*$")


class HeartbeatFileError(Exception):
    """HEARTBEAT.md is there but may not be read (a symlink, not a regular file, too big)."""


def heartbeat_job(cfg: HeartbeatConfig, *, now: float) -> Job:
    return Job(
        id=HEARTBEAT_ID,
        name="heartbeat",
        agent=cfg.agent,
        schedule=make_schedule(every=cfg.every, now=now),
        message="",
        channel=cfg.channel,
        peer=cfg.peer,
        session=cfg.session or f"agent:{cfg.agent}:heartbeat",
        timeout_s=cfg.timeout_seconds,
        overlap="skip",
        misfire="skip",
        owner=cfg.owner,
        created_by="config (automation.heartbeat)",
        created_at=now,
        system=True,
    )


def read_tasks(workspace: Path) -> list[str]:
    """The active tasks in `workspace`/HEARTBEAT.md; [] when there is no such file.
    Blocking (run it in a thread). Raises HeartbeatFileError for a file that must
    not be read."""
    try:
        dfd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    except OSError as e:  # a link, or not a folder: not where the agent's workspace should be
        raise HeartbeatFileError(f"the workspace {workspace} is not a plain folder ({e.strerror})") from None
    try:
        try:
            fd = os.open(FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except FileNotFoundError:
            return []
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise HeartbeatFileError(f"{FILE} is a symlink; it is not followed") from None
            raise HeartbeatFileError(f"{FILE}: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise HeartbeatFileError(f"{FILE} is not a regular file")
            if st.st_size > MAX_BYTES:
                raise HeartbeatFileError(f"{FILE} is {st.st_size} bytes, more than {MAX_BYTES}")
            data = os.read(fd, MAX_BYTES + 1)[:MAX_BYTES]
        finally:
            os.close(fd)
    finally:
        os.close(dfd)
    return active_tasks(data.decode("utf-8", "replace"))


def active_tasks(text: str) -> list[str]:
    """The list items under a heading "Active tasks" (any level, any case), up to
    the next heading. Done items (`- [x] ...`) and empty ones are not tasks."""
    tasks: list[str] = []
    inside = False
    for line in text.splitlines():
        h = _HEADING.match(line)
        if h is not None:
            inside = h.group(2).strip().rstrip(":").lower() == "active tasks"
            continue
        if not inside:
            continue
        m = _ITEM.match(line)
        if m is None or (m.group(1) or "").lower() == "x":
            continue
        item = m.group(2).strip()
        if item and not item.startswith("<!--"):
            tasks.append(item)
    return tasks


def is_ack(reply: str) -> bool:
    """Whether the turn said there is nothing to tell."""
    text = reply.strip()
    if text.startswith(ACK):
        rest = text[len(ACK) :]
    elif text.endswith(ACK):
        rest = text[: -len(ACK)]
    else:
        return False
    return len(rest.strip(" \n\t.:-—")) <= ACK_MAX_CHARS
