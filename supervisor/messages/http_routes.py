"""Plugins' HTTP routes on the gateway's HTTP server (the http channel's), under
`/plugins/<plugin id>/<path>`: each request is looked up in the registry when it
arrives (routes come and go with their plugin), checked, and handed to the plugin's
sandbox over gRPC with the plugin's deadline (`plugins.entries.<id>.http`).

- `auth: "gateway"` (the default) asks for the gateway's bearer token, as the http
  channel does, and the plugin never sees it: `Authorization` is dropped;
- `auth: "plugin"` lets any caller through for the plugin to judge (a webhook's
  signature); the supervisor registers such a route only where the operator allowed
  it (`allowPluginAuth`, supervisor/sandboxes/offers.py). The gateway's token is
  dropped there too, should a caller send it;
- the request body is bounded by the http channel's cap (its aiohttp app), the
  answer by MAX_ANSWER_BODY, and the plugin's answer is checked before any of it is
  sent: a bad one is a 502 with the reason, a plugin that is down a 503, one that
  overran its deadline a 504. Our own answers are plain text.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from aiohttp import web
from loguru import logger
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator

from clawsup.sandbox import offers
from clawsup.sandbox.manifest import format_validation_error
from clawsup.supervisor.errors import OfferFailed
from clawsup.supervisor.names import owner_label
from clawsup.supervisor.sandboxes.lifecycle import SandboxState
from clawsup.supervisor.sandboxes.registry import Kind

if TYPE_CHECKING:
    from clawsup.supervisor.messages.channels.plugin import PluginSandboxes
    from clawsup.supervisor.sandboxes.supervised import SupervisedSandbox

PREFIX = "/plugins"
MAX_ANSWER_BODY = 1024 * 1024
"""Bytes of a route's answer body (UTF-8)."""
MAX_ANSWER_HEADERS = 64
MAX_HEADER_VALUE = 8192
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")
_SAFE_VALUE = re.compile(r"[\t\x20-\x7e]*")
"""Printable ASCII and tabs: no line break of any encoding's idea reaches the wire."""
FRAMING_HEADERS = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "trailer", "te", "proxy-connection"})
"""How the answer is framed is the gateway's to say, not the plugin's: one of these
from a plugin could split or smuggle a response."""
NO_BODY = frozenset({204, 304})


class RouteAnswer(BaseModel):
    """What a route's handler answers (besides a plain string, a 200)."""

    model_config = ConfigDict(extra="forbid")
    # 1xx is no final answer, and a plugin does not switch protocols.
    status: StrictInt = Field(default=200, ge=200, le=599)
    headers: dict[str, str] = Field(default_factory=dict, max_length=MAX_ANSWER_HEADERS)
    body: str = ""

    @field_validator("headers")
    @classmethod
    def _safe_headers(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            if _TOKEN.fullmatch(name) is None:
                raise ValueError(f"{name[:64]!r} is not a header name")
            if name.lower() in FRAMING_HEADERS:
                raise ValueError(f"{name} is the gateway's to set")
            if len(value) > MAX_HEADER_VALUE or _SAFE_VALUE.fullmatch(value) is None:
                raise ValueError(f"header {name}: a value is at most {MAX_HEADER_VALUE} printable ASCII characters (and tabs) on one line")
        return v

    @field_validator("body")
    @classmethod
    def _bounded(cls, v: str) -> str:
        n = len(v.encode("utf-8", errors="replace"))
        if n > MAX_ANSWER_BODY:
            raise ValueError(f"{n} bytes; the most is {MAX_ANSWER_BODY}")
        return v


def _plain(status: int, text: str, **headers: str) -> web.Response:
    return web.Response(status=status, text=text + "\n", headers=headers or None)


class PluginRoutes:
    """The plugins' routes, dispatched at request time. Created by
    `channels_from_config` with the sandbox manager and handed to the http channel,
    which mounts `handle` under PREFIX."""

    def __init__(self, sandboxes: PluginSandboxes) -> None:
        self._sandboxes = sandboxes

    async def handle(self, request: web.Request, *, authorized: bool) -> web.Response:
        """One request to `/plugins/{plugin}/{tail}`; `authorized`: it carries the
        gateway's bearer token."""
        plugin, path = request.match_info["plugin"], request.match_info["tail"]
        if not offers.valid_route(path):
            return _plain(404, "no such route")
        reg = self._sandboxes.registry.get(Kind.HTTP_ROUTE, path, owner=plugin)
        sb = self._sandboxes.sandboxes.get(reg.sandbox_id) if reg is not None and reg.sandbox_id is not None else None
        if reg is None or sb is None:
            return self._absent(plugin, path)
        auth = reg.offer.auth if reg.offer is not None else "gateway"
        if auth != "plugin" and not authorized:
            return _plain(401, "missing or wrong bearer token")
        body = await request.read()  # bounded by the app's client_max_size (413 past it)
        payload: dict[str, Any] = {
            "method": request.method,
            "path": path,
            "query": {k: request.query.getone(k) for k in request.query},
            "headers": _headers(request, drop_authorization=authorized or auth != "plugin"),
            "body": body.decode("utf-8", errors="replace"),
        }
        route = f"{PREFIX}/{plugin}/{path}"
        try:
            answer = await sb.call_offer("http_route", path, payload, sb.plan.offers.http_timeout_s)
        except OfferFailed as e:
            status = 504 if e.how == "timed_out" else 503 if e.how in ("down", "died") else 502
            logger.warning("{} {}: {}", request.method, route, e)
            return _plain(status, str(e))
        return _answer(answer, route, sb)

    def _absent(self, plugin: str, path: str) -> web.Response:
        """No registration: a 503 while the plugin that declares the route is not
        ready (it comes back with it), else 404 (no such plugin or route, or the
        supervisor refused it: its log says why)."""
        for sb in self._sandboxes.sandboxes.values():
            p = sb.plan
            if p.role == "plugin" and p.plugin_id == plugin and path in p.offers.declares("http_route") and sb.lc.state is not SandboxState.READY:
                return _plain(503, f"{owner_label(plugin)} is not running ({sb.lc.state.value}); try again later")
        return _plain(404, "no such route")


def _headers(request: web.Request, *, drop_authorization: bool) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in request.headers.items():
        if drop_authorization and name.lower() == "authorization":
            continue
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


def _answer(answer: Any, route: str, sb: SupervisedSandbox) -> web.Response:
    """The plugin's answer as the response, if it is a good one."""
    if isinstance(answer, str):
        answer = {"body": answer}
    try:
        good = RouteAnswer.model_validate(answer)
        if good.status in NO_BODY and good.body:
            raise ValueError(f"a {good.status} answer has no body")
    except (ValidationError, ValueError) as e:
        why = format_validation_error(e) if isinstance(e, ValidationError) else str(e)
        said = f"route {route} answered badly: {why}"
        sb.log.event(said)
        logger.warning("{}: {}", sb.id, said)
        return _plain(502, f"{said}; a route answers a string or {{\"status\": int, \"headers\": {{...}}, \"body\": str}}")
    headers = dict(good.headers)
    if good.status not in NO_BODY and not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = "text/plain; charset=utf-8"
    return web.Response(status=good.status, body=good.body.encode("utf-8", errors="replace") if good.status not in NO_BODY else None, headers=headers)
