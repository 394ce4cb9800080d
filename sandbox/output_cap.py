"""The exec output cap: the first half of `cap` bytes passes as it comes, the rest is
a ring released at the end, after a marker that says how much was dropped between.

One shape, kept on both sides of the wire: by the host's exec runner
(sandbox/host/exec_runner.py), and again by the supervisor, because a hijacked host
may send anything (supervisor/sandboxes/host_client.py; tests/test_hostile_output.py). Stdlib
only, so that both may import it.
"""

from __future__ import annotations

from collections.abc import Callable


class HeadTail:
    """At most `cap` bytes (plus `tail_extra`, plus the marker) of a byte stream. One
    per stream; `feed` what arrives, then `finish` once."""

    def __init__(self, cap: int, *, marker: Callable[[int], str], tail_extra: int = 0) -> None:
        cap = max(cap, 2)
        self.cap = cap
        self.head_left = cap - cap // 2
        self.ring_size = cap // 2 + tail_extra
        self.ring = bytearray()
        self.total = 0
        self.dropped = 0
        self._marker = marker

    def feed(self, data: bytes) -> bytes:
        """What may be passed on now; the rest is kept in the ring or dropped."""
        self.total += len(data)
        now = b""
        if self.head_left:
            now, data = data[: self.head_left], data[self.head_left :]
            self.head_left -= len(now)
        if data:
            if len(data) >= self.ring_size:
                # One chunk past the ring: never grow the ring to its size first.
                self.dropped += len(self.ring) + len(data) - self.ring_size
                self.ring = bytearray(data[len(data) - self.ring_size :])
            else:
                self.ring += data
                excess = len(self.ring) - self.ring_size
                if excess > 0:
                    del self.ring[:excess]
                    self.dropped += excess
        return now

    def finish(self) -> bytes:
        if not self.dropped:
            return bytes(self.ring)
        return self._marker(self.dropped).encode() + bytes(self.ring)

    @property
    def truncated(self) -> bool:
        return self.dropped > 0
