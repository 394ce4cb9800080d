"""Where a tool call is checked and dispatched: input schemas and argument checks, the
exec screen, the core tools and the workspace sandboxes they run in."""
