"""The child side: `python -m sandbox.host` loads one plugin folder and serves it over
gRPC. Never imported by the supervisor."""
