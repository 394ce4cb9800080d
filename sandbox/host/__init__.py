"""The child side: `python -m clawsup.sandbox.host` loads one plugin folder and serves it over
gRPC. Never imported by the supervisor."""
