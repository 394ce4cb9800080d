"""clawsup: a gateway for personal AI agents where nothing untrusted runs inside the
gateway. `clawsup.supervisor` is the trusted process, `clawsup.sandbox` the children
and their launchers, `clawsup.v1` the wire protocol between them, and
`clawsup.plugins` the bundled plugins.

Kept empty of imports: a sandbox child imports this package first."""
