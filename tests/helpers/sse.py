"""Reading the http channel's server-sent events in tests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.client import HTTPResponse
from typing import Any


def read_events(resp: HTTPResponse) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event, data) pairs as they arrive, until the stream ends."""
    event = None
    for raw in resp:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            assert event is not None, line
            yield event, json.loads(line[6:])
