"""The child side: `python -m clawsup.sandbox.host` serves, over gRPC, one plugin folder,
a workspace's core tools, a subagent run's loop, or one MCP server's tools (as that
server's MCP client). Never imported by the supervisor."""
