"""Where a session's turn runs: the agent loop's supervisor side (`loop.py`; the loop
itself is clawsup.sandbox.agent_loop, shared with subagent runs), the model providers
it talks to (`models.py`, `providers/`), the tool policy that decides what a turn may
call, loop detection, and subagent runs (`subagents.py` and the `run_*` modules)."""
