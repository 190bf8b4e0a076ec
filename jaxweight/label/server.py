"""The labelling page over HTTP: a Starlette app, served by uvicorn on a background thread.

Why Starlette and not FastAPI: the page needs five routes and one small JSON
body; FastAPI would add pydantic and its dependency tree for validation that a
few explicit checks do (``LabelBoard.submit``). Starlette is the ASGI toolkit
FastAPI itself is built on, uvicorn its usual server; both are maintained by
the Encode team. uvicorn runs in a thread (``uvicorn.Server`` with a socket we
bind, ``should_exit`` to stop), so the training loop's thread is free to wait.

Routes (every one needs ``?token=...`` or the ``X-Label-Token`` header, else
403 and nothing happens; the token is compared with ``hmac.compare_digest``):

- ``GET /``: the page; ``GET /static/{name}``: its script and style (package data);
- ``GET /api/state``: the open round and the run's progress as JSON (:meth:`LabelBoard.snapshot`);
- ``POST /api/label``: ``{"round": int, "pair": int, "choice": "left" | "right" | "equal" | "skip"}``,
  answered 200 with the new state only after the label is fsync-ed to the log;
  400 malformed body (nested or not JSON included), 404 unknown pair, 409
  labelled twice or round not open, 413 body over ``max_body`` bytes, 422
  unknown choice: a JSON ``{"error": ...}`` and nothing changes;
- ``POST /api/undo``: ``{"round": int, "pair": int}``, the round's last answer
  taken back (a new log line; 409 when ``pair`` is not that answer);
- ``GET /clip/{round}/{pair}/{side}``: a fragment's animated GIF.

The server binds to a loopback address only (``127.0.0.1`` by default) and
answers only requests addressed to it by name: the ``Host`` header must be
``127.0.0.1:PORT`` or ``localhost:PORT`` (a page of another site that
re-resolves its own name to 127.0.0.1 sends its own name: refused), and a
POST that says where it comes from (``Origin``, ``Sec-Fetch-Site``) must come
from the page itself. Refusals are 403 with ``{"error", "code"}``: ``code`` is
``"token"`` (the page then says the server restarted with a new address), ``"host"`` or ``"origin"``;
a page request (``GET /``) with an outdated token gets a short HTML page saying so.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import secrets
import socket
import threading
import time
from importlib import resources
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .board import LabelBoard, LabelError

__all__ = ["make_app", "LabelServer", "check_token", "MAX_BODY", "TOKEN_HEADER"]

#: the largest request body accepted, in bytes (a label is ~50)
MAX_BODY = 4096
TOKEN_HEADER = "x-label-token"
_STATIC = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
           "style.css": "text/css; charset=utf-8"}
_HEADERS = {
    "Referrer-Policy": "no-referrer",  # the token is in the URL: never hand it to another site
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
}
_PAGE_HEADERS = {**_HEADERS, "Cache-Control": "no-store",
                 "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"}
_FIELDS = {"round", "pair", "choice"}
_UNDO_FIELDS = {"round", "pair"}
#: the deepest JSON nesting a body may have (a label is one flat object)
_MAX_DEPTH = 4
_RESTARTED = ("the labelling server restarted with a new address: open the new URL printed in the terminal "
              "(this page's token is out of date)")
_RESTARTED_PAGE = (b"<!doctype html><html lang=en><meta charset=utf-8><title>jaxweight: address out of date</title>"
                   b"<body style='font:16px system-ui,sans-serif;max-width:40rem;margin:3rem auto'>"
                   b"<h1>This address is out of date</h1><p>The labelling server restarted with a new address. "
                   b"Open the new URL printed in the terminal (<code>[label] compare clips at ...</code>). "
                   b"Every label given so far is kept.</p></body></html>")


def check_token(token: str) -> str:
    """Refuse tokens that are short or unsafe in a URL.

    Raises:
      ValueError: fewer than 16 characters, or characters other than ``A-Z a-z 0-9 - _``.
    """
    ok = isinstance(token, str) and len(token) >= 16 and all(c.isascii() and (c.isalnum() or c in "-_")
                                                               for c in token)
    if not ok:
        raise ValueError("token must be >= 16 URL-safe characters (secrets.token_urlsafe()), "
                         f"got {token if not isinstance(token, str) else f'{len(token)} characters'!r}")
    return token


def _error(status: int, message: str, code: str | None = None) -> JSONResponse:
    body = {"error": message, "status": status} | ({"code": code} if code else {})
    return JSONResponse(body, status_code=status, headers=_PAGE_HEADERS)


def _split_host(value: str) -> tuple[str, int | None] | None:
    """``(name, port)`` of a ``Host`` header or an origin's authority (``[::1]:80`` kept bracketed); None if malformed."""
    name, sep, port = value.rpartition(":")
    if not sep or name.endswith(":") or (name.startswith("[") != name.endswith("]")):
        name, port = value, ""
    if port and not port.isdigit():
        return None
    return name.lower(), (int(port) if port else None)


class _Gate:
    """ASGI middleware: every HTTP request must be addressed to this server by name and carry the token;
    a POST that names its origin must come from the page.

    ``port``: the bound port, set by :class:`LabelServer` once it listens (None: any port).
    """

    def __init__(self, app: Any, token: str, host: str):
        self.app = app
        self._token = token.encode()
        self.names = {"localhost", f"[{host}]" if ":" in host else host}
        self.port: int | None = None

    def _host_ok(self, value: str | None) -> bool:
        parts = None if value is None else _split_host(value)
        return parts is not None and parts[0] in self.names and (self.port is None or parts[1] == self.port)

    def _origin_ok(self, req: Request) -> bool:
        site = req.headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            return False
        origin = req.headers.get("origin")
        if origin is None:  # not a browser's cross-site request: those always name their origin
            return True
        scheme, sep, authority = origin.partition("://")
        return scheme == "http" and bool(sep) and self._host_ok(authority)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            req = Request(scope)
            refusal = None
            if not self._host_ok(req.headers.get("host")):
                refusal = _error(403, "forbidden: address this server as 127.0.0.1:PORT or localhost:PORT", "host")
            else:
                given = req.query_params.get("token") or req.headers.get(TOKEN_HEADER) or ""
                if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), self._token):
                    if req.method == "GET" and scope["path"] == "/" and given:
                        refusal = Response(_RESTARTED_PAGE, status_code=403, media_type=_STATIC["index.html"],
                                           headers=_PAGE_HEADERS)
                    else:
                        refusal = _error(403, f"forbidden: {_RESTARTED}" if given else
                                         "forbidden: this page needs the token printed with its URL", "token")
                elif req.method == "POST" and not self._origin_ok(req):
                    refusal = _error(403, "forbidden: answers come from the labelling page only", "origin")
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _read_body(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise LabelError(400, f"bad Content-Length {length!r}")
        if int(length) > limit:
            raise LabelError(413, f"request body of {length} bytes is over the {limit}-byte limit")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise LabelError(413, f"request body is over the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


def _depth(text: str) -> int:
    """The deepest ``[`` / ``{`` nesting of a JSON text (brackets inside strings not counted)."""
    depth = deepest = 0
    in_str = escaped = False
    for c in text:  # host-side request parsing: a few dozen characters
        if in_str:
            escaped, in_str = (not escaped and c == "\\"), in_str and (escaped or c != '"')
        elif c == '"':
            in_str = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def _parse(body: bytes, fields: set[str]) -> dict[str, Any]:
    what = "{" + ", ".join(sorted(fields)) + "}"
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise LabelError(400, f"the body must be a JSON object {what} in UTF-8") from None
    if _depth(text) > _MAX_DEPTH:
        raise LabelError(400, f"the body must be a flat JSON object {what}, not nested {_MAX_DEPTH}+ levels deep")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise LabelError(400, f"the body must be a JSON object {what}") from None
    if not isinstance(data, dict):
        raise LabelError(400, f"the body must be a JSON object {what}, got {type(data).__name__}")
    if set(data) != fields:
        missing, extra = sorted(fields - set(data)), sorted(set(data) - fields)
        detail = (f"; missing {missing}" if missing else "") + (f"; unexpected {extra}" if extra else "")
        raise LabelError(400, f"the body must have exactly the fields {sorted(fields)}{detail}")
    return data


def _parse_label(body: bytes) -> tuple[Any, Any, Any]:
    data = _parse(body, _FIELDS)
    return data["round"], data["pair"], data["choice"]


def make_app(board: LabelBoard, token: str, *, max_body: int = MAX_BODY, host: str = "127.0.0.1") -> Any:
    """The ASGI app of the page for ``board``: the Starlette routes behind the gate (host, token, origin).

    Args:
      board: the shared round state.
      token: the secret every request must carry (see :func:`check_token`).
      max_body: the largest POST body accepted, in bytes.
      host: the loopback address served (``Host`` may name it or ``localhost``);
        set the returned app's ``port`` to require the port too.

    Raises:
      ValueError: a weak token or ``max_body < 64``.
    """
    check_token(token)
    if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 64:
        raise ValueError(f"max_body must be an int >= 64 bytes, got {max_body!r}")
    package = resources.files(__package__) / "static"
    static = {name: (package / name).read_bytes() for name in _STATIC}
    # the page's own script and style need the token too (check_token allows URL-safe characters only)
    index = static.pop("index.html").replace(b"__TOKEN__", token.encode("ascii"))

    async def page(request: Request) -> Response:
        return Response(index, media_type=_STATIC["index.html"], headers=_PAGE_HEADERS)

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in static:
            return _error(404, f"no static file {name!r}")
        return Response(static[name], media_type=_STATIC[name], headers=_PAGE_HEADERS)

    async def state(request: Request) -> Response:
        return JSONResponse(board.poll(), headers=_PAGE_HEADERS)

    async def label(request: Request) -> Response:
        try:
            body = await _read_body(request, max_body)
            snap = await run_in_threadpool(board.submit, *_parse_label(body))  # fsync off the event loop
        except LabelError as e:
            return _error(e.status, e.message)
        return JSONResponse({"ok": True, "state": snap}, headers=_PAGE_HEADERS)

    async def undo(request: Request) -> Response:
        try:
            data = _parse(await _read_body(request, max_body), _UNDO_FIELDS)
            snap = await run_in_threadpool(board.undo, data["round"], data["pair"])
        except LabelError as e:
            return _error(e.status, e.message)
        return JSONResponse({"ok": True, "state": snap}, headers=_PAGE_HEADERS)

    async def clip(request: Request) -> Response:
        p = request.path_params
        try:
            gif = await run_in_threadpool(board.clip, p["round"], p["pair"], p["side"])
        except LabelError as e:
            return _error(e.status, e.message)
        # the page adds the pair's digest to the URL, so a cached clip is never the wrong one
        return Response(gif, media_type="image/gif", headers={**_HEADERS, "Cache-Control": "private, max-age=3600"})

    routes = [
        Route("/", page, methods=["GET"]),
        Route("/static/{name}", asset, methods=["GET"]),
        Route("/api/state", state, methods=["GET"]),
        Route("/api/label", label, methods=["POST"]),
        Route("/api/undo", undo, methods=["POST"]),
        Route("/clip/{round:int}/{pair:int}/{side:int}", clip, methods=["GET"]),
    ]
    app = Starlette(routes=routes)
    return _Gate(app, token, host)


def _loopback(host: str) -> str:
    try:
        ok = ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"host must be a loopback address such as '127.0.0.1' (the page is for this machine "
                         f"only), got {host!r}")
    return host


class LabelServer:
    """uvicorn serving :func:`make_app` on a daemon thread.

    Args:
      board: the shared round state.
      host: a loopback address (default ``127.0.0.1``).
      port: the port (0: any free one; :attr:`port` says which after :meth:`start`).
      token: the secret (default: ``secrets.token_urlsafe(32)``); reuse one to let
        an open page go on after a restart on the same port.
      max_body: the largest POST body, in bytes.

    Raises:
      ValueError: a non-loopback ``host``, a port outside ``[0, 65535]``, a weak token.
    """

    def __init__(self, board: LabelBoard, *, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 max_body: int = MAX_BODY):
        self.host = _loopback(host)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an int in [0, 65535] (0: any free port), got {port!r}")
        self.token = check_token(secrets.token_urlsafe(32) if token is None else token)
        self.app = make_app(board, self.token, max_body=max_body, host=self.host)
        self._port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    @property
    def port(self) -> int:
        """The bound port (the requested one before :meth:`start`)."""
        return self._port

    @property
    def url(self) -> str:
        """``http://HOST:PORT/?token=...`` (the address to open in a browser)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/?token={self.token}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout: float = 30.0) -> str:
        """Bind, serve on a background thread and return :attr:`url` once it answers (idempotent).

        Raises:
          OSError: the port cannot be bound.
          RuntimeError: the server did not start within ``timeout`` seconds.
        """
        if self.running:
            return self.url
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self._port))
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._port = sock.getsockname()[1]
        self.app.port = self._port  # Host must name this port
        config = uvicorn.Config(self.app, host=self.host, port=self._port, log_config=None, log_level="warning",
                                access_log=False, lifespan="off", ws="none", http="h11", loop="asyncio",
                                server_header=False, proxy_headers=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name="jaxweight-label-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the labelling server stopped while starting (see the log above)")
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the labelling server did not start within {timeout} s")
            time.sleep(0.01)
        return self.url

    def close(self, timeout: float = 10.0) -> None:
        """Stop serving (``should_exit``) and wait for the thread; idempotent."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        if self._sock is not None:
            self._sock.close()
        self._server = self._thread = self._sock = None
