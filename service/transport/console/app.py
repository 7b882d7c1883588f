"""The console's HTTP side: an aiohttp application on the server's event loop, its pages
rendered from Jinja2 templates (templates/) and its static files (static/) served from the package.

Pages: `/` the spaces (ListSpaces) and the calls per method (the server's metrics, polled by
htmx); `/spaces/S` what S holds (DescribeSpace); `/spaces/S/browse` its entries a page at a time
(Browse, "more" fetched by htmx); `/spaces/S/tail` a live tail of the writes matching a template
(Notify, sent to the browser as server-sent events). `/login` keeps a bearer token in a cookie
when the server authenticates callers. Nothing is changed from the console: it only reads.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import jinja2
from aiohttp import web

from outrig._codec import decode_value, encode_template_into
from outrig._entry import GenericEntry
from outrig.service.transport.console.calls import Caller, ConsoleError
from outrig.service.transport.console.rates import Rates
from outrig.service.transport.metrics import Metrics
from outrig.service.transport.servicer import SpaceServicer
from outrig.v1 import space_pb2 as pb

__all__ = ["TOKEN_COOKIE", "Console", "make_app"]

log = logging.getLogger("outrig.service")

HERE = Path(__file__).parent
#: The cookie that holds the browser's bearer token.
TOKEN_COOKIE = "outrig_token"
#: Entries a browse page shows.
PAGE = 50
#: Seconds a tail's notify registration lasts (the page reopens it when it ends).
TAIL_LEASE = 600.0

_STATUS_PAGES = {
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _shown(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return f"<{len(value)} bytes>"
    if hasattr(value, "tolist"):  # array.array, numpy
        return value.tolist()
    return repr(value)


def fields_text(entry: pb.Entry) -> str:
    """An entry's fields as compact JSON, bytes shown by their length."""
    fields = {name: decode_value(entry.fields[name]) for name in sorted(entry.fields)}
    return json.dumps(fields, default=_shown, ensure_ascii=False)


def _template(request: web.Request) -> pb.Template | None:
    """The template of the query's `type` and `where` (FIELD=VALUE, VALUE as JSON when it is)."""
    type_name = request.query.get("type", "")
    if not type_name:
        return None
    fields: dict[str, Any] = {}
    for condition in request.query.getall("where", []):
        name, _, text = condition.partition("=")
        try:
            fields[name] = json.loads(text)
        except json.JSONDecodeError:
            fields[name] = text
    template = pb.Template()
    encode_template_into(template, GenericEntry(type_name, (), fields))
    return template


class Console:
    """The console of one server: its application and, once started, its HTTP site."""

    def __init__(self, servicer: SpaceServicer, metrics: Metrics | None, *, authenticates: bool) -> None:
        self.servicer = servicer
        self.authenticates = authenticates
        self.rates = Rates(metrics.calls if metrics is not None else list)
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=jinja2.select_autoescape(["html"]),
            undefined=jinja2.StrictUndefined,
        )
        self.app = make_app(self)
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        """Serve on host:port (0: any free port); the bound port."""
        # A handler is cancelled when its browser goes away: a tail's registration ends with it.
        self._runner = web.AppRunner(
            self.app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, shutdown_timeout=1.0)
        await site.start()
        server = site._server  # aiohttp keeps the asyncio server here; its socket says the port
        sockets = getattr(server, "sockets", None) or ()
        self.port = int(sockets[0].getsockname()[1]) if sockets else port
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def caller(self, request: web.Request) -> Caller:
        return Caller(self.servicer, request.cookies.get(TOKEN_COOKIE), request.remote or "?")

    def page(self, name: str, status: int = 200, **values: Any) -> web.Response:
        text = self.templates.get_template(name).render(authenticates=self.authenticates, **values)
        return web.Response(text=text, status=status, content_type="text/html")


def make_app(console: Console) -> web.Application:
    app = web.Application(middlewares=[_failures(console)])
    app.router.add_get("/", _index(console))
    app.router.add_get("/calls", _calls(console))
    app.router.add_get("/spaces/{space}", _space(console))
    app.router.add_get("/spaces/{space}/browse", _browse(console, rows_only=False))
    app.router.add_get("/spaces/{space}/browse/rows", _browse(console, rows_only=True))
    app.router.add_get("/spaces/{space}/tail", _tail_page(console))
    app.router.add_get("/spaces/{space}/tail/events", _tail_events(console))
    app.router.add_get("/login", _login_page(console))
    app.router.add_post("/login", _login(console))
    app.router.add_post("/logout", _logout)
    app.router.add_static("/static/", HERE / "static", append_version=True)
    return app


def _failures(console: Console) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ConsoleError as err:
            status = _STATUS_PAGES.get(err.status, 502)
            return console.page("error.html", status, code=err.status.name, message=err.message)

    return middleware


def _index(console: Console) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        listed = await console.caller(request).unary("ListSpaces", pb.ListSpacesRequest())
        return console.page("index.html", spaces=list(listed.spaces))

    return handler


def _calls(console: Console) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        await console.caller(request).unary("ListSpaces", pb.ListSpacesRequest())  # the admin grant
        rates, window = console.rates.now()
        return console.page("calls.html", rates=rates, window=window)

    return handler


def _space(console: Console) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        space = request.match_info["space"]
        described = await console.caller(request).unary("DescribeSpace", pb.DescribeSpaceRequest(space=space))
        return console.page("space.html", space=space, d=described, fields_of=_template_fields)

    return handler


def _template_fields(template: pb.Template) -> str:
    return (
        fields_text(pb.Entry(type_name=template.type_name, fields=template.fields)) if template.fields else ""
    )


def _browse(console: Console, *, rows_only: bool) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        space = request.match_info["space"]
        template = _template(request)
        try:
            after = int(request.query.get("after", "0"))
        except ValueError:
            raise ConsoleError(grpc.StatusCode.INVALID_ARGUMENT, "after: not a number") from None
        browse = pb.BrowseRequest(space=space, after=after, max_entries=PAGE)
        if template is not None:
            browse.templates.append(template)
        page = await console.caller(request).unary("Browse", browse)
        values = {
            "space": space,
            "type": request.query.get("type", ""),
            "where": request.query.getall("where", []),
            "entries": list(page.entries),
            "next": page.next,
            "fields_text": fields_text,
        }
        return console.page("rows.html" if rows_only else "browse.html", **values)

    return handler


def _tail_page(console: Console) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        space = request.match_info["space"]
        await console.caller(request).unary("DescribeSpace", pb.DescribeSpaceRequest(space=space))
        type_name = request.query.get("type", "")
        return console.page("tail.html", space=space, type=type_name, where=request.query.getall("where", []))

    return handler


def _tail_events(console: Console) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        space = request.match_info["space"]
        template = _template(request)
        if template is None:
            raise ConsoleError(grpc.StatusCode.INVALID_ARGUMENT, "type: a tail needs an entry type")
        caller = console.caller(request)
        await caller.unary("DescribeSpace", pb.DescribeSpaceRequest(space=space))  # the admin grant
        notify = pb.NotifyRequest(
            space=space, templates=[template], lease=pb.LeaseDuration(seconds=TAIL_LEASE)
        )
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        events = caller.notify(notify)
        await response.prepare(request)
        await response.write(b": tailing\n\n")  # the browser's EventSource opens now
        try:
            async for event in events:
                row = console.templates.get_template("tail_row.html").render(
                    sequence=event.sequence, entry=event.entry, fields_text=fields_text
                )
                await response.write(b"data: " + row.replace("\n", " ").encode() + b"\n\n")
        except ConsoleError as err:
            await response.write(f"event: failed\ndata: {err.status.name}: {err.message}\n\n".encode())
        except ConnectionResetError:  # the browser went away: the registration ends with the loop
            pass
        finally:
            await events.aclose()  # type: ignore[attr-defined]
        return response

    return handler


def _login_page(console: Console) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return console.page("login.html")

    return handler


def _login(console: Console) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        form = await request.post()
        token = str(form.get("token", "")).strip()
        response = web.HTTPSeeOther("/")
        response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="Strict", path="/")
        raise response

    return handler


async def _logout(request: web.Request) -> web.StreamResponse:
    response = web.HTTPSeeOther("/login")
    response.del_cookie(TOKEN_COOKIE, path="/")
    raise response
