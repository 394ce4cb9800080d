"""Where a sandbox's life is driven: its plan, each incarnation from launch to reaping,
its lifecycle states and restarts, the gRPC client that speaks to its host, its log,
what it registered (`registry`) and the set of all of them (`manager`)."""
