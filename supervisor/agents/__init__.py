"""Where a session's turn runs: the agent loop, the model providers it talks to, the
tool policy that decides what a turn may call, loop detection, and subagent runs."""
