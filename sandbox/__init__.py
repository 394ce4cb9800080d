"""Everything about children: the launch backends (supervisor side) and the host
runtime (child side, in `sandbox.host`).

Kept import-light on purpose: `python -m sandbox.host` imports this package before it
sets its death signal and reads its start gate, and nothing here may delay that.
"""
