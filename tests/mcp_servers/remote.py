"""A remote MCP server for the tests of clawsup's MCP sandboxes (tests/test_mcp.py):
the official `mcp` SDK's MCPServer over streamable HTTP (at /mcp), served by uvicorn
on 127.0.0.1, refusing every request that does not carry
`Authorization: Bearer <$MCP_TEST_TOKEN>` (401).

    echo(text)   returns `text`
    whoami()     the request headers it saw, as JSON, with the token replaced by "<the test token>"

Run as `MCP_TEST_TOKEN=... python tests/mcp_servers/remote.py [PORT]` (0 or nothing:
any free port). When it listens it prints one line on stdout, `READY <port>`.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from starlette.types import ASGIApp, Receive, Scope, Send

TOKEN = os.environ["MCP_TEST_TOKEN"]

server: MCPServer[Any] = MCPServer("remote")


@server.tool(structured_output=False)
def echo(text: str) -> str:
    return text


@server.tool(structured_output=False)
def whoami(ctx: Context) -> str:
    seen = dict(ctx.headers or {})
    if seen.get("authorization") == f"Bearer {TOKEN}":
        seen["authorization"] = "Bearer <the test token>"
    return json.dumps(seen, sort_keys=True)


class RequireToken:
    """Every HTTP request needs the bearer token; lifespan events pass."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (b"authorization", f"Bearer {TOKEN}".encode()) not in scope["headers"]:
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"missing or wrong bearer token\n"})
            return
        await self.app(scope, receive, send)


class AnnouncingServer(uvicorn.Server):
    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        assert sockets
        print(f"READY {sockets[0].getsockname()[1]}", flush=True)


def main() -> None:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    # Bound here, so that port 0 gives a port we can announce.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    app = RequireToken(server.streamable_http_app())
    AnnouncingServer(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


if __name__ == "__main__":
    main()
