"""The trusted process: config, registry, sandbox manager, control API, CLI.

Never imports plugin code, `plugins/`, or the child's runtime (`clawsup.sandbox.host`,
`clawsup.sandbox.api`); tests/test_boundaries.py walks the imports to keep it so.
"""
