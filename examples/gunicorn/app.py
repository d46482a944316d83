"""A small stateful MCP server (Streamable HTTP, protocol 2025-03-26 to 2025-11-25)
as a plain ASGI app, written to behave like the Python MCP SDK on the wire.

Like the SDK, every process keeps its sessions in its own memory (a dict), so a
request that reaches a process that did not create its session gets 404. That
is why a gunicorn with several workers behind one socket breaks sessions, and
why each worker gets an address of its own behind `mcp_proxy` (the hooks in
mcp_affinity_hooks.py, or one single-worker gunicorn per port).

Wire behaviour (POST, GET and DELETE on /mcp):

- POST `initialize` without a session: mints `uuid4().hex`, answers 200 JSON
  with `mcp-session-id`. Every later response of the session repeats the
  header, as python-sdk does.
- POST without a session, not `initialize` (e.g. the go-sdk client's
  `server/discover` probe at MCP-Protocol-Version 2026-07-28): 400, so
  clients fall back to `initialize`.
- Unknown or deleted session: 404
  `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Session not found"}}`.
- Notifications and responses (no `id`): 202, no body.
- `tools/list`; `tools/call whoami` answers with structured content
  `{"server": "<name>-pid<pid>", "session": "<id>"}`; `ping`.
- GET: 405 (no standalone SSE stream). DELETE: 200, the session is forgotten.
- A Host other than `127.0.0.1:<port>`, `localhost:<port>` or `[::1]:<port>`,
  or none, is refused with 421 `Invalid Host header`, like python-sdk's
  DNS-rebinding protection (on by default for servers bound to 127.0.0.1).
  `mcp_proxy` sends `Host: <upstream host:port>` to TCP upstreams.

It also speaks the legacy HTTP+SSE transport (protocol 2024-11-05) as
python-sdk's SseServerTransport does (what fastapi-mcp's mount() serves):

- GET /sse opens the session's stream; its first event, with CRLF line ends as
  sse-starlette writes them, is `event: endpoint` with
  `data: <root_path>/messages/?session_id=<uuid4 hex>`.
- POST /messages/?session_id=<id> answers 202 "Accepted" and sends the
  JSON-RPC response as an `event: message` on that stream; no session_id:
  400 "session_id is required"; not a UUID: 400 "Invalid session ID"; a
  session this process does not hold: 404 "Could not find session".
- The session ends when its stream closes.

The server name is $MCP_SERVER_NAME (default "gunicorn") plus the worker's pid,
so the workers of one gunicorn are told apart.

$MCP_MAX_SESSIONS, if set above 0, caps the live sessions of each process as
the Python MCP SDK 2.2 does at its cap (10,000 by default there): an
`initialize` past that many answers 503 with `Retry-After: 1` and a JSON-RPC
error, and only a DELETE frees a slot (no idle reaper, as with FastMCP's
`session_idle_timeout=None`).

Run it: gunicorn app:app (with gunicorn.conf.py and its hooks), or one single-worker
gunicorn per port: gunicorn app:app -k uvicorn.workers.UvicornWorker --workers 1 --bind 127.0.0.1:9001
"""

import asyncio
import json
import os
import urllib.parse
import uuid

SERVER_NAME = os.environ.get("MCP_SERVER_NAME", "gunicorn")
ENDPOINT = os.environ.get("MCP_ENDPOINT", "/mcp")
MAX_SESSIONS = int(os.environ.get("MCP_MAX_SESSIONS", "0") or 0)
SUPPORTED_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
LATEST_VERSION = SUPPORTED_VERSIONS[0]
# python-sdk's default when bound to loopback: a loopback host *with a port*.
ALLOWED_HOSTS = ("127.0.0.1:*", "localhost:*", "[::1]:*")

# session ID -> negotiated protocol version. One event loop per process, so no lock.
sessions = {}

SSE_ENDPOINT = "/sse"
MESSAGES_ENDPOINT = "/messages/"
LEGACY_VERSION = "2024-11-05"
# legacy HTTP+SSE session ID -> the queue of messages for its stream.
streams = {}

WHOAMI_TOOL = {
    "name": "whoami",
    "description": "Reports the server (name and worker pid) and the session ID it sees.",
    "inputSchema": {"type": "object", "properties": {}},
    "outputSchema": {
        "type": "object",
        "properties": {
            "server": {"type": "string", "description": "name of the server that handled the call"},
            "session": {"type": "string", "description": "MCP session ID as the server sees it"},
        },
        "required": ["server", "session"],
    },
}


def server_id():
    # Computed per call: with --preload the module is imported by the master.
    return "%s-pid%d" % (SERVER_NAME, os.getpid())


def rpc_error(code, message, req_id=None):
    return {"jsonrpc": "2.0", "id": req_id, "error": {"code": code, "message": message}}


async def read_body(receive):
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def send_response(send, status, payload=None, session=None, extra=()):
    headers = list(extra)
    body = b""
    if payload is not None:
        body = json.dumps(payload, separators=(",", ":")).encode()
        headers.append((b"content-type", b"application/json"))
    if session is not None:
        headers.append((b"mcp-session-id", session.encode()))
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def host_allowed(host):
    """python-sdk's TransportSecurityMiddleware._validate_host: exact match, or
    "<host>:*" matching "<host>:<any port>"; a missing or empty Host fails."""
    host = host.lower()
    if not host:
        return False
    for allowed in ALLOWED_HOSTS:
        if host == allowed or (allowed.endswith(":*") and host.startswith(allowed[:-1])):
            return True
    return False


def handle_request(msg, session):
    """Returns the JSON-RPC response to a request of an initialized session."""
    method, req_id = msg.get("method"), msg.get("id")
    params = msg.get("params") or {}
    if method == "ping":
        return {"jsonrpc": "2.0", "id": req_id, "result": {}}
    if method == "tools/list":
        return {"jsonrpc": "2.0", "id": req_id, "result": {"tools": [WHOAMI_TOOL]}}
    if method == "tools/call":
        if params.get("name") != "whoami":
            return rpc_error(-32602, "Unknown tool: %s" % params.get("name"), req_id)
        who = {"server": server_id(), "session": session}
        return {
            "jsonrpc": "2.0",
            "id": req_id,
            "result": {
                "content": [{"type": "text", "text": json.dumps(who)}],
                "structuredContent": who,
                "isError": False,
            },
        }
    return rpc_error(-32601, "Method not found: %s" % method, req_id)


async def handle_mcp(scope, receive, send):
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    method = scope["method"]
    if not host_allowed(headers.get("host", "")):
        # python-sdk answers with plain text here.
        await send({"type": "http.response.start", "status": 421,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"19")]})
        await send({"type": "http.response.body", "body": b"Invalid Host header"})
        return
    session = headers.get("mcp-session-id")
    known = session is not None and session in sessions

    if method == "GET":
        if session is not None and not known:
            await send_response(send, 404, rpc_error(-32600, "Session not found"))
            return
        await send_response(send, 405, rpc_error(-32000, "Method Not Allowed: no standalone SSE stream"),
                            session=session if known else None, extra=[(b"allow", b"POST, DELETE")])
        return
    if method == "DELETE":
        if session is None:
            await send_response(send, 400, rpc_error(-32600, "Bad Request: Missing session ID"))
        elif not known:
            await send_response(send, 404, rpc_error(-32600, "Session not found"))
        else:
            del sessions[session]
            await send_response(send, 200, session=session)
        return
    if method != "POST":
        await send_response(send, 405, rpc_error(-32000, "Method Not Allowed"), extra=[(b"allow", b"GET, POST, DELETE")])
        return

    body = await read_body(receive)
    if "application/json" not in headers.get("accept", "") and "*/*" not in headers.get("accept", ""):
        await send_response(send, 406, rpc_error(-32600, "Not Acceptable: Client must accept application/json"))
        return
    if not headers.get("content-type", "").startswith("application/json"):
        await send_response(send, 415, rpc_error(-32600, "Unsupported Media Type: Content-Type must be application/json"))
        return
    try:
        msg = json.loads(body)
    except ValueError:
        await send_response(send, 400, rpc_error(-32700, "Parse error"))
        return
    if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
        await send_response(send, 400, rpc_error(-32600, "Invalid Request: batches and non-JSON-RPC bodies are not supported"))
        return

    if msg.get("method") == "initialize":
        if session is not None:
            await send_response(send, 400, rpc_error(-32600, "Bad Request: initialize must not carry a session ID", msg.get("id")))
            return
        if 0 < MAX_SESSIONS <= len(sessions):
            await send_response(send, 503, rpc_error(-32000, "Service Unavailable: too many sessions (%d); end one with DELETE"
                                                     % MAX_SESSIONS, msg.get("id")), extra=[(b"retry-after", b"1")])
            return
        wanted = (msg.get("params") or {}).get("protocolVersion")
        version = wanted if wanted in SUPPORTED_VERSIONS else LATEST_VERSION
        session = uuid.uuid4().hex
        sessions[session] = version
        result = {
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": server_id(), "version": "1.0.0"},
        }
        await send_response(send, 200, {"jsonrpc": "2.0", "id": msg.get("id"), "result": result}, session=session)
        return

    # Like python-sdk: session first (missing 400, unknown 404), then the protocol version.
    if session is None:
        await send_response(send, 400, rpc_error(-32600, "Bad Request: Missing session ID"))
        return
    if not known:
        await send_response(send, 404, rpc_error(-32600, "Session not found"))
        return
    version = headers.get("mcp-protocol-version")
    if version is not None and version not in SUPPORTED_VERSIONS:
        await send_response(send, 400, rpc_error(-32600, "Bad Request: Unsupported protocol version: %s" % version),
                            session=session)
        return
    if "id" not in msg or "method" not in msg:
        # A notification (e.g. notifications/initialized) or a response.
        await send_response(send, 202, session=session)
        return
    await send_response(send, 200, handle_request(msg, session), session=session)


async def send_text(send, status, text):
    body = text.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def sse_event(event, data):
    return ("event: %s\r\ndata: %s\r\n\r\n" % (event, data)).encode()


async def wait_disconnect(receive):
    while (await receive())["type"] != "http.disconnect":
        pass


async def handle_sse(scope, receive, send):
    """GET /sse: a legacy session's stream, open until the client leaves."""
    session, queue = uuid.uuid4().hex, asyncio.Queue()
    streams[session] = queue
    endpoint = scope.get("root_path", "").rstrip("/") + MESSAGES_ENDPOINT + "?session_id=" + session
    disconnected = asyncio.ensure_future(wait_disconnect(receive))
    try:
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-store"),
            (b"x-accel-buffering", b"no")]})
        await send({"type": "http.response.body", "body": sse_event("endpoint", endpoint), "more_body": True})
        while True:
            get = asyncio.ensure_future(queue.get())
            await asyncio.wait({get, disconnected}, return_when=asyncio.FIRST_COMPLETED)
            if disconnected.done():
                get.cancel()
                return
            message = json.dumps(get.result(), separators=(",", ":"))
            await send({"type": "http.response.body", "body": sse_event("message", message), "more_body": True})
    finally:
        del streams[session]
        disconnected.cancel()


def legacy_reply(msg, session):
    """Returns the response to a message of a legacy session, None for a notification."""
    if "id" not in msg or "method" not in msg:
        return None
    if msg["method"] != "initialize":
        return handle_request(msg, session)
    wanted = (msg.get("params") or {}).get("protocolVersion")
    version = wanted if wanted in SUPPORTED_VERSIONS + (LEGACY_VERSION,) else LEGACY_VERSION
    result = {
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": False}},
        "serverInfo": {"name": server_id(), "version": "1.0.0"},
    }
    return {"jsonrpc": "2.0", "id": msg["id"], "result": result}


async def handle_message(scope, receive, send):
    """POST /messages/?session_id=: a message of a legacy session."""
    body = await read_body(receive)
    query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
    session = query.get("session_id", [None])[0]
    if session is None:
        await send_text(send, 400, "session_id is required")
        return
    try:
        uuid.UUID(hex=session)
    except ValueError:
        await send_text(send, 400, "Invalid session ID")
        return
    queue = streams.get(session)
    if queue is None:
        await send_text(send, 404, "Could not find session")
        return
    try:
        msg = json.loads(body)
    except ValueError:
        await send_text(send, 400, "Could not parse message")
        return
    await send_text(send, 202, "Accepted")
    reply = legacy_reply(msg, session)
    if reply is not None:
        await queue.put(reply)


async def handle_legacy(scope, receive, send):
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    if not host_allowed(headers.get("host", "")):
        await send_text(send, 421, "Invalid Host header")
    elif scope["path"] == SSE_ENDPOINT and scope["method"] == "GET":
        await handle_sse(scope, receive, send)
    elif scope["path"] == MESSAGES_ENDPOINT and scope["method"] == "POST":
        await handle_message(scope, receive, send)
    else:
        await send_text(send, 405, "Method Not Allowed")


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    if scope["path"] in (SSE_ENDPOINT, MESSAGES_ENDPOINT):
        await handle_legacy(scope, receive, send)
        return
    if scope["path"] != ENDPOINT:
        await read_body(receive)
        await send_response(send, 404, rpc_error(-32600, "Not Found"))
        return
    await handle_mcp(scope, receive, send)
