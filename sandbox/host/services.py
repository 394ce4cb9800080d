"""A plugin's background services inside its sandbox (`api.register_service`): each
one the supervisor starts runs as a task of this host, and all are stopped, within a
deadline, when the host is told to stop.

A service whose `start` raises takes its sandbox down: the host tells the supervisor
which service and why (`service.state` on the Connect stream), then exits with
SERVICE_FAILED_EXIT, and the supervisor restarts the sandbox with its backoff, as it
would after any crash. Created by `serve` for a plugin host; lives inside `_listen`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

from clawsup.sandbox.api import Offer
from clawsup.sandbox.handshake import SERVICE_FAILED_EXIT, SERVICE_STATE

# How long the supervisor's word about a failed service may take before the host
# exits anyway: the exit's reason then lacks the service's name, nothing worse.
REPORT_TIMEOUT_S = 2.0
DEFAULT_STOP_S = 2.0


class Services:
    def __init__(
        self,
        *,
        request: Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]],
        say: Callable[[str], None],
        exit: Callable[[int], NoReturn],
    ) -> None:
        self._request = request
        self._say = say
        self._exit = exit
        self._started: dict[str, Offer] = {}
        self._tg: asyncio.TaskGroup | None = None
        self._tasks: list[asyncio.Task[None]] = []
        # Set when `stop_all` takes its list: a service started after it would never
        # be asked to stop.
        self._stopping = False

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The services' lifetime: they run while inside; leaving cancels any still
        running (after `stop_all` has asked them to end)."""
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            try:
                yield
            finally:
                self._tg = None
                for task in self._tasks:
                    task.cancel()

    def start(self, offer: Offer) -> str | None:
        """Start one service; why not, or None when it runs."""
        if self._tg is None or self._stopping:
            return "the host is stopping"
        if offer.name in self._started:
            return f"service {offer.name!r} is already running"
        self._started[offer.name] = offer
        self._tasks.append(self._tg.create_task(self._run(offer), name=f"service {offer.name}"))
        self._say(f"service {offer.name!r} started")
        return None

    async def _run(self, offer: Offer) -> None:
        try:
            if offer.is_async:
                await offer.handler({})
            else:
                await _on_own_thread(lambda: offer.handler({}), f"service {offer.name}")
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - a service's SystemExit is its failure too
            error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            self._say(f"service {offer.name!r} raised; the sandbox restarts:\n{traceback.format_exc()}")
            with contextlib.suppress(Exception):
                async with asyncio.timeout(REPORT_TIMEOUT_S):
                    await self._request(SERVICE_STATE, {"id": offer.name, "error": error[:500]})
            self._exit(SERVICE_FAILED_EXIT)

    async def stop_all(self, deadline_s: float) -> None:
        """Each started service's `stop`, in parallel, within `deadline_s` in all; a
        stop that raises or overruns is named in the log, and the host stops anyway.
        No service starts once this has begun."""
        self._stopping = True
        stops = [(name, o.stop) for name, o in self._started.items() if o.stop is not None]
        if not stops:
            return
        late = {name for name, _ in stops}

        async def one(name: str, stop: Callable[[], Any]) -> None:
            try:
                if inspect.iscoroutinefunction(stop):
                    await stop()
                else:
                    # Cannot be interrupted: the deadline moves on without it.
                    await _on_own_thread(stop, f"stop {name}")
                self._say(f"service {name!r} stopped")
            except Exception as e:
                self._say(f"service {name!r}: its stop raised {type(e).__name__}: {e}")
            late.discard(name)  # not when cancelled at the deadline: then it was late

        try:
            async with asyncio.timeout(max(deadline_s, 0.05)), asyncio.TaskGroup() as tg:
                for name, stop in stops:
                    tg.create_task(one(name, stop), name=f"stop {name}")
        except TimeoutError:
            names = ", ".join(repr(n) for n in sorted(late))
            self._say(f"service{'s' if len(late) > 1 else ''} {names} did not stop within {deadline_s:g} s; the host stops anyway")


async def _on_own_thread(fn: Callable[[], Any], name: str) -> Any:
    """`fn()` on a daemon thread of its own, awaited. Not `asyncio.to_thread`: the
    loop's pool is joined when `asyncio.run` ends, so a sync service (or stop) that
    never returns would hold the host's exit until the supervisor's SIGKILL; this
    thread is left behind, and `run` ends the process with os._exit
    (tests/test_plugin_services.py, the stop that hangs)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if done.done():  # its awaiter was cancelled (the deadline, a stop)
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(value)

    def run() -> None:
        try:
            value, error = fn(), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiter, whatever it is
            value, error = None, e
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await done
