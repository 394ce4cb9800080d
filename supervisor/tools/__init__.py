"""Where a tool call is checked and dispatched: the dispatcher (`dispatch`, the one
path every tool call takes), input schemas and argument checks (`schemas`,
`arguments`), the core tools (`core`), the workspace sandboxes they run in
(`workspaces`, settled by `workspace_settings`), the exec screen, and `clawsup exec
run` (`exec_once`)."""
