"""Everything about children. `launch/` runs in the supervisor and starts them;
`host/` is the child side (`python -m clawsup.sandbox.host`) and never runs in the
supervisor. The modules here at the root are shared by both sides (the handshake,
socket paths, protected paths, the output cap, the exec result, the agent loop), or
are the plugin authoring API (`api`), which plugins import inside their child, or
the plugin manifest's model (`manifest`), which only the supervisor reads.

Kept import-light on purpose: `python -m clawsup.sandbox.host` imports this package before it
sets its death signal and reads its start gate, and nothing here may delay that.
"""
