"""The operator's side: the gateway's assembly (`gateway`, the composition root), the
control API over its unix socket, and the `clawsup` CLI."""
