"""A misbehaving stdio MCP server, written with the official `mcp` SDK, for the tests
of clawsup's MCP sandboxes (tests/test_mcp.py). Each tool acts out one thing a real
server may do to its client:

    echo(text)              returns `text`
    structured()            structured content {"answer": 42, "items": ["a", "b"]}, with the same JSON as text
    crash(how="exit")       ends the server: "exit" os._exit(3), "kill" SIGKILLs itself
    hang()                  sleeps forever, but honours notifications/cancelled (then writes
                            "unruly: hang cancelled" on stderr)
    hang_hard(seconds=3600) blocks the server's event loop: cancels and pings go unanswered
    flood(lines=5000)       writes `lines` non-MCP lines on the real stdout, then returns "flooded N lines"
    long_line(n_bytes)      writes one stdout line of n_bytes (default 17 MiB), past the client's 16 MiB bound
    huge(n_bytes)           returns a text of n_bytes "x"
    change_tools(notifications=1)
                            adds the tool `added_tool` (it returns "added") if absent, else removes it,
                            then sends notifications/tools/list_changed `notifications` times;
                            returns "added added_tool" or "removed added_tool"
    fail()                  isError, text "the unruly server failed on purpose"
    image()                 one image block: a 1x1 PNG (image/png, 70 bytes)
    resource()              a text block "resources follow", an embedded text resource
                            (file:///unruly/notes.txt, text/plain, 31 bytes), an embedded blob
                            (file:///unruly/blob.bin, application/octet-stream, 1000 bytes) and a
                            resource link (file:///unruly/big.bin, name big.bin)
    shout(text)             writes `text` as one line on stderr (the sandbox log); returns "shouted"

Flags: `--hang-initialize` reads stdin and never answers (initialize included);
`--exit-at-start N` writes a line on stderr and exits with N before reading
anything; `--banner` prints two non-MCP lines on stdout before serving.

Run as `python tests/mcp_servers/unruly.py [flags]`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import signal
import sys
import time
from typing import Any

import mcp.types as types
from mcp.server.mcpserver import Context, MCPServer

# The SDK points fd 1 at stderr while it serves, so that stray prints miss the wire.
# The flood must hit the wire: it writes to a copy of the real stdout taken first.
WIRE = os.dup(1)

# A valid 1x1 transparent PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAAC0lEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)

server: MCPServer[Any] = MCPServer("unruly")
# Tools that return a str are declared plain: MCPServer would otherwise add
# structured content ({"result": ...}) to them, which clients take as the result.


@server.tool(structured_output=False)
def echo(text: str) -> str:
    return text


@server.tool()
def structured() -> types.CallToolResult:
    data = {"answer": 42, "items": ["a", "b"]}
    return types.CallToolResult(content=[types.TextContent(type="text", text='{"answer": 42, "items": ["a", "b"]}')], structured_content=data)


@server.tool(structured_output=False)
def crash(how: str = "exit") -> str:
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(3)


@server.tool(structured_output=False)
async def hang() -> str:
    try:
        await asyncio.sleep(10**9)
    except asyncio.CancelledError:
        # The client's notifications/cancelled reached us: say so, for the tests.
        print("unruly: hang cancelled", file=sys.stderr, flush=True)
        raise
    return "never"


@server.tool(structured_output=False)
async def hang_hard(seconds: float = 3600) -> str:
    time.sleep(seconds)  # on purpose: blocks the loop, so nothing else is answered
    return "woke up"


@server.tool(structured_output=False)
def hang_sync(seconds: float = 3600) -> str:
    time.sleep(seconds)  # a sync tool runs in a worker thread: pings are still answered
    return "woke up"


@server.tool(structured_output=False)
def flood(lines: int = 5000) -> str:
    for i in range(lines):
        os.write(WIRE, f"unruly noise line {i}: this is not JSON-RPC\n".encode())
    return f"flooded {lines} lines"


@server.tool(structured_output=False)
def long_line(n_bytes: int = 17 * 1024 * 1024) -> str:
    chunk = b"y" * (1024 * 1024)
    left = n_bytes
    while left > 0:
        left -= os.write(WIRE, chunk[: min(left, len(chunk))])
    os.write(WIRE, b"\n")
    return "wrote a long line"


@server.tool(structured_output=False)
def huge(n_bytes: int) -> str:
    return "x" * n_bytes


def added_tool() -> str:
    return "added"


@server.tool(structured_output=False)
async def change_tools(ctx: Context, notifications: int = 1) -> str:
    if any(t.name == "added_tool" for t in await server.list_tools()):
        server.remove_tool("added_tool")
        done = "removed added_tool"
    else:
        server.add_tool(added_tool, structured_output=False)
        done = "added added_tool"
    for _ in range(notifications):
        await ctx.session.send_tool_list_changed()
    return done


@server.tool()
def fail() -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text="the unruly server failed on purpose")], is_error=True)


@server.tool()
def image() -> types.CallToolResult:
    return types.CallToolResult(content=[types.ImageContent(type="image", data=base64.b64encode(PNG).decode(), mime_type="image/png")])


@server.tool()
def resource() -> types.CallToolResult:
    notes = types.TextResourceContents(uri="file:///unruly/notes.txt", mime_type="text/plain", text="hello from an embedded resource")
    blob = types.BlobResourceContents(uri="file:///unruly/blob.bin", mime_type="application/octet-stream", blob=base64.b64encode(bytes(1000)).decode())
    return types.CallToolResult(
        content=[
            types.TextContent(type="text", text="resources follow"),
            types.EmbeddedResource(type="resource", resource=notes),
            types.EmbeddedResource(type="resource", resource=blob),
            types.ResourceLink(type="resource_link", uri="file:///unruly/big.bin", name="big.bin"),
        ]
    )


@server.tool(structured_output=False)
def shout(text: str) -> str:
    print(text, file=sys.stderr, flush=True)
    return "shouted"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--hang-initialize", action="store_true")
    p.add_argument("--exit-at-start", type=int)
    p.add_argument("--banner", action="store_true")
    args = p.parse_args()
    if args.exit_at_start is not None:
        print(f"unruly: exiting with {args.exit_at_start} at start, as asked", file=sys.stderr, flush=True)
        os._exit(args.exit_at_start)
    print("unruly: starting", file=sys.stderr, flush=True)
    if args.hang_initialize:
        for _ in sys.stdin.buffer:  # read, so the client's writes never block; answer nothing
            pass
        return
    if args.banner:
        os.write(WIRE, b"unruly banner: hello, this is not MCP\nsecond banner line\n")
    server.run()


if __name__ == "__main__":
    main()
