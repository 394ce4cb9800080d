"""clawsup's bundled plugins, one folder each; installed as `clawsup.plugins` so that
an installed clawsup finds `bundled:NAME`. Nothing here is imported by the supervisor:
each plugin runs in its own sandbox."""
