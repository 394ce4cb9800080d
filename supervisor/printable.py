"""Text from a child, made safe to write to a log file or to print on a terminal.

A child controls everything it prints, logs, names or raises. Written out as it came,
a carriage return or a line separator lets it forge a whole line (`\\r2025-… [clawsup]
ready`), an escape sequence drives the operator's terminal (clear the screen, set the
window title, hide text), and a bidi override makes a line read backwards. So every
character that moves the cursor, breaks a line or changes how the rest of the line is
shown is written escaped instead, the way Python's `repr` would show it: ESC as
`\\x1b`, CR as `\\r`, U+2028 as `\\u2028`. Tab stays a tab. Backslashes stay as they
are, so that an escaped line escapes to itself (the CLI escapes what it reads back
from files again, for files written before this rule or by other hands).

Used where a child's text leaves the supervisor: the sandbox logs
(supervisor/sandboxes/log.py), the supervisor's own log (`clean_log_record`, a loguru
patcher installed by supervisor/control/gateway.py) and `clawsup logs`/`clawsup status`.
Tests: tests/test_hostile_output.py.
"""

from __future__ import annotations

import re
import traceback
from typing import Any

# C0 controls but tab, DEL, C1 controls (NEL among them), the line and paragraph
# separators (with \n, \r, \v, \f, \x1c-\x1e and \x85 these are every character
# str.splitlines() breaks on), the bidi controls (marks, embeddings, overrides,
# isolates) and lone surrogates, which JSON can carry and a UTF-8 file cannot take.
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    named = _NAMED.get(c)
    if named is not None:
        return named
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}"


def printable(text: str) -> str:
    """`text` with every control character, line break, bidi control and lone
    surrogate shown escaped; anything else, tab included, unchanged. At most six
    characters come out for one that goes in."""
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(_escape, text)


def printable_lines(text: str) -> str:
    """Like `printable`, but the newlines stay: for text whose lines are the
    supervisor's own (a traceback of its code)."""
    return "\n".join(printable(line) for line in text.split("\n"))


def clean_log_record(record: Any) -> None:
    """A loguru patcher: a record's message is escaped, so a tool name, a refusal
    reason or a child's last stderr line cannot start a line of the supervisor's log
    or reach the terminal it prints on. An exception goes into the message as a
    traceback whose frames keep their lines, while the exception's own text, which
    may quote a child, is escaped whole."""
    record["message"] = printable(record["message"])
    exc = record["exception"]
    if exc is None or exc.value is None:
        return
    record["message"] += "\n" + _traceback_text(exc.value).rstrip("\n")
    record["exception"] = None


# The lines Python writes between the parts of a traceback (Lib/traceback.py).
_STRUCTURE = (
    "Traceback (most recent call last):\n",
    "\nThe above exception was the direct cause of the following exception:\n\n",
    "\nDuring handling of the above exception, another exception occurred:\n\n",
)


def _traceback_text(exc: BaseException) -> str:
    # Frame chunks are indented and come from the supervisor's own files; every other
    # chunk is an exception's text (or a note), which ends with one newline of its own.
    out = []
    for chunk in traceback.TracebackException.from_exception(exc).format():
        if chunk.startswith(" ") or chunk in _STRUCTURE:
            out.append(printable_lines(chunk))
        else:
            out.append(printable(chunk[:-1] if chunk.endswith("\n") else chunk) + "\n")
    return "".join(out)
