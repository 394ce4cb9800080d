"""What the heartbeat reads (supervisor/automation/heartbeat.py): the active tasks in
HEARTBEAT.md, and whether a reply is only the acknowledgement. From a file the
agent's commands can write: links, FIFOs, folders and huge files are refused, never
followed or waited on."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from clawsup.supervisor.automation.heartbeat import HeartbeatFileError, active_tasks, is_ack, read_tasks

DOC = """# Heartbeat

Some words.

## Active tasks
- check the build
* [ ] water the plants
+ [x] already done
1. call mum
   - a nested item counts too
<!-- - a comment is not a task -->

## Later
- not active
"""


def test_active_tasks_are_the_open_items_under_their_heading() -> None:
    assert active_tasks(DOC) == ["check the build", "water the plants", "call mum", "a nested item counts too"]
    assert active_tasks("### ACTIVE TASKS:\n- one\n") == ["one"]
    assert active_tasks("## Active tasks\n\nnothing listed\n") == []
    assert active_tasks("- a list without the heading\n") == []
    assert active_tasks("") == []


@pytest.mark.parametrize(
    "reply, ack",
    [
        ("HEARTBEAT_OK", True),
        ("  HEARTBEAT_OK.\n", True),
        ("All quiet. HEARTBEAT_OK", True),
        ("HEARTBEAT_OK " + "x" * 301, False),
        ("The build is red.", False),
        ("I said HEARTBEAT_OK earlier but now the build is red.", False),
        ("", False),
    ],
)
def test_only_a_reply_that_is_the_acknowledgement_stays_silent(reply: str, ack: bool) -> None:
    assert is_ack(reply) is ack


def test_the_file_is_read_only_when_it_is_a_regular_file_of_bounded_size(tmp_path: Path) -> None:
    ws = tmp_path / "workspace"
    ws.mkdir()
    assert read_tasks(ws) == []  # no file: no tasks
    assert read_tasks(tmp_path / "missing") == []
    (ws / "HEARTBEAT.md").write_text(DOC)
    assert read_tasks(ws)[0] == "check the build"

    secret = tmp_path / "secret"
    secret.write_text("## Active tasks\n- SECRET\n")
    (ws / "HEARTBEAT.md").unlink()
    (ws / "HEARTBEAT.md").symlink_to(secret)
    with pytest.raises(HeartbeatFileError, match="is a symlink; it is not followed"):
        read_tasks(ws)

    (ws / "HEARTBEAT.md").unlink()
    os.mkfifo(ws / "HEARTBEAT.md")
    # A FIFO with no writer would block an open for reading forever: it is refused at once.
    result: list[BaseException] = []
    t = threading.Thread(target=lambda: result.append(pytest.raises(HeartbeatFileError, read_tasks, ws).value))
    t.start()
    t.join(5)
    assert not t.is_alive() and "not a regular file" in str(result[0])

    (ws / "HEARTBEAT.md").unlink()
    (ws / "HEARTBEAT.md").mkdir()
    with pytest.raises(HeartbeatFileError):
        read_tasks(ws)

    (ws / "HEARTBEAT.md").rmdir()
    (ws / "HEARTBEAT.md").write_text("## Active tasks\n" + "- x\n" * 20_000)
    with pytest.raises(HeartbeatFileError, match="more than 65536"):
        read_tasks(ws)


def test_a_workspace_that_is_itself_a_link_is_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "HEARTBEAT.md").write_text("## Active tasks\n- SECRET\n")
    (tmp_path / "workspace").symlink_to(elsewhere)
    with pytest.raises(HeartbeatFileError):
        read_tasks(tmp_path / "workspace")
