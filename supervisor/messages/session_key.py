"""Which conversation a message joins: OpenClaw's session keys, all lower-case.

| case                                  | key                                              |
|---------------------------------------|--------------------------------------------------|
| direct, dmScope `main` (the default)  | agent:<id>:main                                  |
| direct, `per-peer`                    | agent:<id>:direct:<peer>                         |
| direct, `per-channel-peer`            | agent:<id>:<channel>:direct:<peer>               |
| direct, `per-account-channel-peer`    | agent:<id>:<channel>:<account>:direct:<peer>     |
| group                                 | agent:<id>:<channel>:group:<id>                  |
| channel                               | agent:<id>:<channel>:channel:<id>                |
| in a thread                           | any of the above + :thread:<id>                  |

`identityLinks` (canonical id -> ["channel:peerId", ...]) makes one person's
identities on several channels one peer in direct-message keys; it applies only when
the scope is not `main` (with `main` every direct message shares one key anyway).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from clawsup.supervisor.config import DmScope


class _Peer(Protocol):
    @property
    def kind(self) -> str: ...
    @property
    def id(self) -> str: ...


class SessionKeys:
    def __init__(self, dm_scope: DmScope, identity_links: Mapping[str, list[str]]) -> None:
        self.dm_scope = dm_scope
        self._links = {ident.strip().lower(): canon.strip().lower() for canon, idents in identity_links.items() for ident in idents}

    @staticmethod
    def main(agent: str) -> str:
        return f"agent:{agent}:main".lower()

    def for_message(self, agent: str, channel: str, account: str, peer: _Peer, thread_id: str | None) -> str:
        pid = peer.id.strip().lower()
        if peer.kind == "direct":
            if self.dm_scope == "main":
                key = self.main(agent)
            else:
                pid = self._links.get(f"{channel}:{pid}", pid)
                key = {
                    "per-peer": f"agent:{agent}:direct:{pid}",
                    "per-channel-peer": f"agent:{agent}:{channel}:direct:{pid}",
                    "per-account-channel-peer": f"agent:{agent}:{channel}:{account}:direct:{pid}",
                }[self.dm_scope]
        else:
            key = f"agent:{agent}:{channel}:{peer.kind}:{pid}"
        if thread_id:
            key += f":thread:{thread_id.strip()}"
        return key.lower()
