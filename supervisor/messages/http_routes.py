"""Plugins' HTTP routes on the gateway's HTTP server (the http channel's), under
`/plugins/<plugin id>/<path>`: each request is looked up in the registry when it
arrives (routes come and go with their plugin), checked, and handed to the plugin's
sandbox over gRPC with the plugin's deadline (`plugins.entries.<id>.http`).

- `auth: "gateway"` (the default) asks for the gateway's bearer token, as the http
  channel does, and the plugin never sees it: `Authorization` is dropped, and so is
  `Cookie` (cookies on 127.0.0.1 are every local service's, not the plugin's);
- `auth: "plugin"` lets any caller through for the plugin to judge (a webhook's
  signature); the supervisor registers such a route only where the operator allowed
  it (`allowPluginAuth`, supervisor/sandboxes/offers.py). The gateway's token is
  dropped there too, should a caller send it;
- a caller without the token learns nothing of the plugins: every path but a
  registered `auth: "plugin"` route is the same 404, and such a route's failures
  are one generic sentence (the detail is in the plugin's log);
- the request body is bounded by the http channel's cap (its aiohttp app), reaches
  the plugin as `body` when it is UTF-8 text and as `bodyBase64` otherwise (bytes a
  webhook's HMAC is computed over stay intact), the answer is bounded by
  MAX_ANSWER_BODY, and the plugin's answer is checked before any of it is sent: a
  bad one (a cookie among them) is a 502 with the reason, a plugin that is down a
  503, one that overran its deadline a 504. Our own answers are plain text, and
  every answer is sandboxed for browsers (ANSWER_HEADERS);
- at most MAX_IN_FLIGHT requests per plugin at once, so that a plugin whose routes
  hang cannot hold all of the http channel's connections.
"""

from __future__ import annotations

import base64
import json
import re
from typing import TYPE_CHECKING, Any

from aiohttp import web
from loguru import logger
from multidict import CIMultiDict
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator

from clawsup.sandbox import offers
from clawsup.sandbox.manifest import format_validation_error
from clawsup.supervisor.errors import OfferFailed
from clawsup.supervisor.names import owner_label
from clawsup.supervisor.sandboxes.lifecycle import SandboxState
from clawsup.supervisor.sandboxes.registry import Kind, Registration

if TYPE_CHECKING:
    from clawsup.supervisor.messages.channels.plugin import PluginSandboxes
    from clawsup.supervisor.sandboxes.supervised import SupervisedSandbox

PREFIX = "/plugins"
MAX_ANSWER_BODY = 1024 * 1024
"""Bytes of a route's answer body (UTF-8)."""
MAX_ANSWER_HEADERS = 64
MAX_HEADER_VALUE = 8192
MAX_BODY_JSON = 2 * 1024 * 1024
"""Characters of a request body as a JSON string: UTF-8 text past it (mostly control
characters, six characters each once escaped) goes as `bodyBase64` instead, which
keeps a request under the 4 MiB a gRPC message may carry."""
MAX_IN_FLIGHT = 32
"""Requests to one plugin's routes at once; past it a 503 with RETRY_AFTER_S."""
RETRY_AFTER_S = 1
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")
_SAFE_VALUE = re.compile(r"[\t\x20-\x7e]*")
"""Printable ASCII and tabs: no line break of any encoding's idea reaches the wire."""
FRAMING_HEADERS = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "trailer", "te", "proxy-connection"})
"""How the answer is framed is the gateway's to say, not the plugin's: one of these
from a plugin could split or smuggle a response."""
COOKIE_HEADERS = frozenset({"set-cookie", "set-cookie2"})
"""Cookies are not scoped by port: one set here would be sent to every service on
the gateway's host, and every route would be sent it back."""
ANSWER_HEADERS = {"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "sandbox"}
"""On every answer under PREFIX: a plugin's page runs as an opaque origin (no script
of it reaches the gateway's origin), and nothing is sniffed into HTML."""
NO_BODY = frozenset({204, 304})
NOT_FOUND = "no such route"
GENERIC_FAILURE = "the plugin could not answer; see its log"


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
            if name.lower() in COOKIE_HEADERS:
                raise ValueError(f"{name}: a route may not set cookies (they would hold for every service on the gateway's host)")
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
    return web.Response(status=status, text=text + "\n", headers={**ANSWER_HEADERS, **headers})


class PluginRoutes:
    """The plugins' routes, dispatched at request time. Created by
    `channels_from_config` with the sandbox manager and handed to the http channel,
    which mounts `handle` under PREFIX."""

    def __init__(self, sandboxes: PluginSandboxes, *, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self._sandboxes = sandboxes
        self._max_in_flight = max_in_flight
        self._in_flight: dict[str, int] = {}

    async def handle(self, request: web.Request, *, authorized: bool) -> web.Response:
        """One request to `/plugins/{plugin}/{tail}`; `authorized`: it carries the
        gateway's bearer token."""
        plugin, path = request.match_info["plugin"], request.match_info["tail"]
        if not offers.valid_route(path):
            return _plain(404, NOT_FOUND)
        reg, sb = self._lookup(plugin, path)
        open_to_all = reg is not None and sb is not None and reg.offer is not None and reg.offer.auth == "plugin"
        if not authorized and not open_to_all:
            # The same answer for a route that needs the token, one of a plugin
            # that is down, and no route at all: without the token nobody learns
            # which plugins there are or how they fare.
            return _plain(404, NOT_FOUND)
        if reg is None or sb is None:
            return self._absent(plugin, path)
        if self._in_flight.get(plugin, 0) >= self._max_in_flight:
            logger.warning("{} {}/{}/{}: {} requests already in flight", request.method, PREFIX, plugin, path, self._max_in_flight)
            return _plain(503, f"too many requests to this plugin's routes at once; try again in {RETRY_AFTER_S} s", **{"Retry-After": str(RETRY_AFTER_S)})
        self._in_flight[plugin] = self._in_flight.get(plugin, 0) + 1
        try:
            return await self._forward(request, plugin, path, reg, sb, detail=not open_to_all)
        finally:
            self._in_flight[plugin] -= 1
            if not self._in_flight[plugin]:
                del self._in_flight[plugin]

    async def _forward(self, request: web.Request, plugin: str, path: str, reg: Registration, sb: SupervisedSandbox, *, detail: bool) -> web.Response:
        """The request handed to the plugin, `detail`: whether the caller may hear why
        it failed (it has the gateway's token)."""
        auth = reg.offer.auth if reg.offer is not None else "gateway"
        body = await request.read()  # bounded by the app's client_max_size (413 past it)
        # The read may have taken a while: the plugin may have died or restarted
        # meanwhile, and what was checked above was about its former registration.
        now, now_sb = self._lookup(plugin, path)
        if now is not reg or now_sb is not sb:
            return _plain(503, f"{owner_label(plugin)} changed while the request was read; try again later" if detail else "the route is not available now; try again later")
        payload: dict[str, Any] = {
            "method": request.method,
            "path": path,
            "query": {k: request.query.getone(k) for k in request.query},
            "headers": _headers(request, plugin_auth=auth == "plugin"),
            **_body(body),
        }
        route = f"{PREFIX}/{plugin}/{path}"
        try:
            answer = await sb.call_offer("http_route", path, payload, sb.plan.offers.http_timeout_s)
        except OfferFailed as e:
            status = 504 if e.how == "timed_out" else 503 if e.how in ("down", "died") else 502
            said = f"route {route}: {e}"
            if e.how != "down":
                sb.log.event(f"{request.method} {said}")
            logger.warning("{} {}", request.method, said)
            return _plain(status, said if detail else GENERIC_FAILURE)
        return _answer(answer, route, sb, detail=detail)

    def _lookup(self, plugin: str, path: str) -> tuple[Registration | None, SupervisedSandbox | None]:
        reg = self._sandboxes.registry.get(Kind.HTTP_ROUTE, path, owner=plugin)
        sb = self._sandboxes.sandboxes.get(reg.sandbox_id) if reg is not None and reg.sandbox_id is not None else None
        return reg, sb

    def _absent(self, plugin: str, path: str) -> web.Response:
        """No registration (for a caller with the token): a 503 while the plugin
        that declares the route is not ready (it comes back with it), else 404 (no
        such plugin or route, or the supervisor refused it: its log says why)."""
        for sb in self._sandboxes.sandboxes.values():
            p = sb.plan
            if p.role == "plugin" and p.plugin_id == plugin and path in p.offers.declares("http_route") and sb.lc.state is not SandboxState.READY:
                return _plain(503, f"{owner_label(plugin)} is not running ({sb.lc.state.value}); try again later")
        return _plain(404, NOT_FOUND)


def _headers(request: web.Request, *, plugin_auth: bool) -> dict[str, str]:
    """The request's headers for the plugin: never the gateway's token, and cookies
    only where the plugin checks its callers itself (a route under the gateway's
    token is sent no cookie: they are the host's, not the plugin's)."""
    dropped = {"authorization"} if plugin_auth else {"authorization", "cookie"}
    out: dict[str, str] = {}
    for name, value in request.headers.items():
        if name.lower() in dropped:
            continue
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


def _body(raw: bytes) -> dict[str, str | None]:
    """`body` as text when it is UTF-8 (its bytes are exactly text.encode()), else
    `bodyBase64`: nothing is replaced, so a signature over the bytes still checks."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        pass
    else:
        if len(json.dumps(text)) <= MAX_BODY_JSON:
            return {"body": text, "bodyBase64": None}
    return {"body": None, "bodyBase64": base64.b64encode(raw).decode("ascii")}


def _answer(answer: Any, route: str, sb: SupervisedSandbox, *, detail: bool) -> web.Response:
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
        return _plain(502, f"{said}; a route answers a string or {{\"status\": int, \"headers\": {{...}}, \"body\": str}}" if detail else GENERIC_FAILURE)
    headers: CIMultiDict[str] = CIMultiDict(good.headers)
    if good.status not in NO_BODY and "Content-Type" not in headers:
        headers["Content-Type"] = "text/plain; charset=utf-8"
    # Added to, not replaced: a plugin's own (stricter) policy holds as well.
    headers["X-Content-Type-Options"] = ANSWER_HEADERS["X-Content-Type-Options"]
    headers.add("Content-Security-Policy", ANSWER_HEADERS["Content-Security-Policy"])
    return web.Response(status=good.status, body=good.body.encode("utf-8", errors="replace") if good.status not in NO_BODY else None, headers=headers)
