"""Bench (p): the cheapest gate there is, so that what (p) measures is the gateway's
cost of asking a gate (one CallOffer to this sandbox), not the gate's own work. A
plain function runs in a worker thread of the host (its deadline enforced there); a
coroutine on the host's loop: config {"async": true} picks the second."""

from clawsup.sandbox.api import hookimpl


def gate(event: dict) -> None:
    return None


async def async_gate(event: dict) -> None:
    return None


@hookimpl
def clawsup_register(api) -> None:  # type: ignore[no-untyped-def]
    api.on("before_tool_call", async_gate if api.config.get("async") else gate)
