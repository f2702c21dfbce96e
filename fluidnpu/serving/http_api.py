"""HTTP/REST transport of the Open Inference protocol (Starlette on uvicorn).

Routes: GET /v2, /v2/health/live, /v2/health/ready, /v2/models/{name}[/versions/{v}],
/v2/models/{name}[/versions/{v}]/ready, POST /v2/models/{name}[/versions/{v}]/infer, GET /metrics.
The infer body is JSON, or JSON followed by raw tensors (the binary-tensor
extension tritonclient uses: `Inference-Header-Content-Length` gives the JSON
part's length, each binary input carries `binary_data_size`); outputs come
back binary when the request asks for it. Starlette parses HTTP; this module
only reads the protocol's JSON.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fluidnpu.errors import FluidError
from fluidnpu.serving.engine import Rejected, resolves
from fluidnpu.serving.protocol import DEADLINE_PARAM, BadRequest, NotFound, deadline_s, output_arrays, timing_params

HEADER_LEN = "inference-header-content-length"
MAX_BODY_BYTES = 4 << 20
_DT = {np.dtype(np.int32): "INT32", np.dtype(np.float32): "FP32"}


def error_response(status: int, msg: str) -> JSONResponse:
    return JSONResponse({"error": msg}, status_code=status)


async def http_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own refusals (no such route, a method the route does not take) in the protocol's form."""
    code = getattr(exc, "status_code", 400)
    return error_response(code, f"{getattr(exc, 'detail', 'bad request')}: {request.method} {request.url.path}"
                                + (" (see GET /v2 and docs/serving.md for the routes)" if code == 404 else ""))


def _rejected(exc: Rejected) -> JSONResponse:
    return error_response(429 if exc.reason == "deadline" else 503, f"rejected ({exc.reason}): {exc}")


def build_app(server: Any) -> Starlette:
    """The ASGI app of `server` (a serving.server.Server: engine, model, token, metrics)."""
    model, engine = server.model, server.engine

    async def live(request: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(request: Request) -> Response:
        return JSONResponse({"ready": engine.ready}, status_code=200 if engine.ready else 503)

    async def server_meta(request: Request) -> Response:
        return JSONResponse({"name": "fluidnpu", "version": "0.1.0", "extensions": ["binary_tensor_data"]})

    def _model(request: Request) -> None:
        model.check_name(request.path_params["name"], request.path_params.get("version"))

    async def model_meta(request: Request) -> Response:
        try:
            _model(request)
        except NotFound as exc:
            return error_response(404, str(exc))
        return JSONResponse(model.metadata())

    async def model_ready(request: Request) -> Response:
        try:
            _model(request)
        except NotFound as exc:
            return error_response(404, str(exc))
        return JSONResponse({"name": model.name, "ready": engine.ready}, status_code=200 if engine.ready else 503)

    async def metrics(request: Request) -> Response:
        body, ctype = server.metrics.exposition()
        return Response(body, media_type=ctype)

    async def infer(request: Request) -> Response:
        t_recv = time.monotonic()
        try:
            _model(request)
            engine.check_room()                  # a flood is refused before its body is read
            body = await read_body(request)
            req, binary = split_body(body, request.headers.get(HEADER_LEN))
            x, deadline, want_binary, outs = decode_request(model, req, binary, engine.slo_s)
        except NotFound as exc:
            return error_response(404, str(exc))
        except BadRequest as exc:
            return error_response(400, str(exc))
        except Rejected as exc:
            return _rejected(exc)
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()
        try:
            ticket = engine.submit_request(x, deadline, resolves(done), loop)
        except Rejected as exc:
            return _rejected(exc)
        except FluidError as exc:
            return error_response(400, str(exc))
        try:
            await done
        except asyncio.CancelledError:          # the client went away: drop its results
            ticket.cancel()
            raise
        results = ticket.results
        errors = [r.error for r in results if r is not None and r.error]
        if errors:
            return error_response(500, f"device error: {errors[0]}")
        arrays = output_arrays(results, model.n_classes)
        t_sent = time.monotonic()
        params = timing_params(results, t_recv, t_sent, deadline)
        engine.note_response(ticket, t_sent - t_recv)
        return encode_response(model, req.get("id"), arrays, outs, want_binary, params)

    app = Starlette(routes=v2_routes(server_meta, live, ready, model_meta, model_ready, infer,
                                     [Route("/metrics", metrics)]),
                    exception_handlers={HTTPException: http_error})
    if server.token:
        app.add_middleware(_TokenAuth, token=server.token)
    return app


def v2_routes(server_meta: Any, live: Any, ready: Any, model_meta: Any, model_ready: Any, infer: Any,
              extra: list[Route]) -> list[Route]:
    """The Open Inference protocol's HTTP routes to these endpoints (a model with or without a version),
    and `extra` ones."""
    routes = [Route("/v2", server_meta), Route("/v2/health/live", live), Route("/v2/health/ready", ready), *extra]
    for base in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        routes += [Route(base, model_meta), Route(base + "/ready", model_ready),
                   Route(base + "/infer", infer, methods=["POST"])]
    return routes


class _TokenAuth:
    """Bearer-token check before any route (health probes excepted): 401, and the queue never sees it."""

    def __init__(self, app: Any, token: str) -> None:
        self.app, self.expect = app, f"Bearer {token}".encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not scope["path"].startswith("/v2/health/"):
            auth = dict(scope.get("headers") or []).get(b"authorization", b"")
            import hmac

            if not hmac.compare_digest(auth, self.expect):
                await error_response(401, "missing or wrong bearer token")(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise BadRequest(f"request body of {declared} bytes exceeds the limit of {MAX_BODY_BYTES}")
    chunks, n = [], 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > MAX_BODY_BYTES:
            raise BadRequest(f"request body exceeds the limit of {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def split_body(body: bytes, header_len: Any) -> tuple[dict, bytes]:
    if header_len is not None:
        try:
            n = int(header_len)
        except ValueError:
            raise BadRequest(f"Inference-Header-Content-Length is not an integer: {header_len!r}") from None
        if not 0 < n <= len(body):
            raise BadRequest(f"Inference-Header-Content-Length {n} is outside the body of {len(body)} bytes")
        head, binary = body[:n], body[n:]
    else:
        head, binary = body, b""
    try:
        req = json.loads(head)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"malformed JSON: {exc}") from None
    if not isinstance(req, dict):
        raise BadRequest("the request must be a JSON object")
    return req, binary


def decode_request(model: Any, req: dict, binary: bytes,
                   slo_s: float) -> tuple[np.ndarray, float, bool, dict[str, bool]]:
    """(input batch, deadline s, any binary output, {output: binary}) of an infer request, or BadRequest."""
    inputs = req.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise BadRequest("the request needs exactly one input tensor in 'inputs'")
    t = inputs[0]
    params = t.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadRequest("input 'parameters' must be an object")
    shape = t.get("shape")
    if not isinstance(shape, list) or not all(isinstance(v, int) for v in shape):
        raise BadRequest("input 'shape' must be a list of integers")
    if "binary_data_size" in params:
        size = params["binary_data_size"]
        if not isinstance(size, int) or size != len(binary):
            raise BadRequest(f"binary_data_size {size!r} does not match the {len(binary)} binary bytes sent")
        data: Any = binary
    else:
        if binary:
            raise BadRequest("binary data sent but no input has binary_data_size")
        if "data" not in t:
            raise BadRequest("input has neither 'data' nor binary_data_size")
        data = t["data"]
    x = model.check_input(t.get("name"), t.get("datatype"), shape, data)
    rp = req.get("parameters") or {}
    if not isinstance(rp, dict):
        raise BadRequest("request 'parameters' must be an object")
    deadline = deadline_s(rp.get(DEADLINE_PARAM), slo_s)
    default_binary = bool(rp.get("binary_data_output", False))
    outs: dict[str, bool] = {}
    requested = req.get("outputs")
    if requested is None:
        outs = {n: default_binary for n in model.check_outputs([])}
    else:
        if not isinstance(requested, list) or not all(isinstance(o, dict) for o in requested):
            raise BadRequest("'outputs' must be a list of objects")
        names = model.check_outputs([o.get("name") for o in requested])
        for o, n in zip(requested, names):
            outs[n] = bool((o.get("parameters") or {}).get("binary_data", default_binary))
    return x, deadline, any(outs.values()), outs


def encode_response(model: Any, req_id: Any, arrays: dict[str, np.ndarray], outs: dict[str, bool],
                    want_binary: bool, params: dict[str, Any]) -> Response:
    """The infer response: JSON, or JSON then the binary outputs (the binary-tensor extension)."""
    body: dict[str, Any] = {"model_name": model.name, "model_version": model.version, "parameters": params,
                            "outputs": []}
    if req_id is not None:
        body["id"] = req_id
    blobs = []
    for name, binary in outs.items():
        a = arrays[name]
        o: dict[str, Any] = {"name": name, "datatype": _DT[a.dtype], "shape": list(a.shape)}
        if binary:
            raw = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
            o["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            o["data"] = a.reshape(-1).tolist()
        body["outputs"].append(o)
    head = json.dumps(body, separators=(",", ":")).encode()
    if not want_binary:
        return Response(head, media_type="application/json")
    return Response(head + b"".join(blobs), media_type="application/octet-stream",
                    headers={"Inference-Header-Content-Length": str(len(head))})
