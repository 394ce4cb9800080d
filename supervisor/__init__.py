"""The trusted process, by room: `sandboxes` (each sandbox's life), `messages` (where
a message is routed), `agents` (where a session's turn runs), `tools` (where a tool
call is dispatched), `control` (the gateway's assembly, the control API, the CLI);
and here at the root what all of them share: config, errors, state paths, names.

Never imports plugin code, `plugins/`, or the child's runtime (`clawsup.sandbox.host`,
`clawsup.sandbox.api`); tests/test_boundaries.py walks the imports to keep it so.
"""
