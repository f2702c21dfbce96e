"""gRPC transport: `inference.GRPCInferenceService` served with grpcio's asyncio server.

The service's messages and servicer base are the protocol's generated stubs
that tritonclient ships (`tritonclient.grpc.service_pb2[_grpc]`), so client
and server are built from the same .proto. Implemented: ServerLive,
ServerReady, ServerMetadata, ModelReady, ModelMetadata, ModelInfer and
ModelStreamInfer (one edge device, one stream, many samples: requests are
admitted as they arrive and answered as their samples exit, so responses may
come back out of order; each carries the request's id). The other RPCs
answer UNIMPLEMENTED from the base class. Rejections: RESOURCE_EXHAUSTED
(deadline cannot be met) or UNAVAILABLE (queue full, draining); in a stream
they are the response's error_message, and the stream goes on.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb, service_pb2_grpc as pbg

from fluidnpu.errors import FluidError
from fluidnpu.serving.engine import Rejected, Ticket, resolves
from fluidnpu.serving.protocol import DEADLINE_PARAM, BadRequest, NotFound, deadline_s, output_arrays, timing_params

_DT = {np.dtype(np.int32): "INT32", np.dtype(np.float32): "FP32"}


class _Failure(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _param(p: Any) -> Any:
    kind = p.WhichOneof("parameter_choice")
    return None if kind is None else getattr(p, kind)


class InferenceService(pbg.GRPCInferenceServiceServicer):
    """The protocol's service over one `Server` (engine, model, token)."""

    def __init__(self, server: Any) -> None:
        self.server, self.model, self.engine = server, server.model, server.engine

    # ---- auth ---------------------------------------------------------------------------------
    async def _auth(self, context: Any) -> None:
        if self.server.token:
            md = dict(context.invocation_metadata() or ())
            if not hmac.compare_digest(md.get("authorization", ""), f"Bearer {self.server.token}"):
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

    # ---- health and metadata ------------------------------------------------------------------
    async def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.engine.ready)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        await self._auth(context)
        return pb.ServerMetadataResponse(name="fluidnpu", version="0.1.0")

    async def ModelReady(self, request: Any, context: Any) -> Any:
        await self._auth(context)
        try:
            self.model.check_name(request.name, request.version)
        except NotFound:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=self.engine.ready)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        await self._auth(context)
        try:
            self.model.check_name(request.name, request.version)
        except NotFound as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        m = self.model.metadata()
        def T(t: dict) -> Any:                   # gRPC's TensorMetadata has no parameters (the input's scale)
            return pb.ModelMetadataResponse.TensorMetadata(name=t["name"], datatype=t["datatype"], shape=t["shape"])

        return pb.ModelMetadataResponse(name=m["name"], versions=m["versions"], platform=m["platform"],
                                        inputs=[T(t) for t in m["inputs"]], outputs=[T(t) for t in m["outputs"]])

    # ---- inference ----------------------------------------------------------------------------
    def _admit(self, request: Any, notify: Callable[[Ticket], None]) -> Ticket:
        """Check and admit one request (its ticket's `notify` runs in this loop once it is answered);
        raises _Failure with the status code of a refusal. A full queue is refused before decoding."""
        try:
            self.model.check_name(request.model_name, request.model_version)
            if len(request.inputs) != 1:
                raise BadRequest("the request needs exactly one input tensor")
            t = request.inputs[0]
            self.engine.check_room()
            if request.raw_input_contents:
                if len(request.raw_input_contents) != 1:
                    raise BadRequest("one raw_input_contents entry per input expected")
                data: Any = request.raw_input_contents[0]
            else:
                data = list(t.contents.fp32_contents)
            x = self.model.check_input(t.name, t.datatype, list(t.shape), data)
            p = request.parameters.get(DEADLINE_PARAM)
            deadline = deadline_s(None if p is None else _param(p), self.engine.slo_s)
            self.model.check_outputs([o.name for o in request.outputs])
            return self.engine.submit_request(x, deadline, notify, self.loop)
        except NotFound as exc:
            raise _Failure(grpc.StatusCode.NOT_FOUND, str(exc)) from None
        except BadRequest as exc:
            raise _Failure(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        except Rejected as exc:
            code = grpc.StatusCode.RESOURCE_EXHAUSTED if exc.reason == "deadline" else grpc.StatusCode.UNAVAILABLE
            raise _Failure(code, f"rejected ({exc.reason}): {exc}") from None
        except FluidError as exc:
            raise _Failure(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None

    def _response(self, request: Any, ticket: Ticket, t_recv: float) -> Any:
        """The answered request's response; _Failure(INTERNAL) when the device failed its samples."""
        results = ticket.results
        errors = [r.error for r in results if r is not None and r.error]
        if errors:
            raise _Failure(grpc.StatusCode.INTERNAL, f"device error: {errors[0]}")
        arrays = output_arrays(results, self.model.n_classes)
        resp = pb.ModelInferResponse(model_name=self.model.name, model_version=self.model.version, id=request.id)
        t_sent = time.monotonic()
        for k, v in timing_params(results, t_recv, t_sent, ticket.deadline_s).items():
            if isinstance(v, bool):
                resp.parameters[k].bool_param = v
            else:
                resp.parameters[k].double_param = float(v)
        for name in [o.name for o in request.outputs] or list(arrays):
            a = arrays[name]
            resp.outputs.add(name=name, datatype=_DT[a.dtype], shape=list(a.shape))
            resp.raw_output_contents.append(a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())
        self.engine.note_response(ticket, t_sent - t_recv)
        return resp

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        await self._auth(context)
        t_recv = time.monotonic()
        done: asyncio.Future = self.loop.create_future()
        try:
            ticket = self._admit(request, resolves(done))
            try:
                await done
            except asyncio.CancelledError:          # the client went away: drop its results
                ticket.cancel()
                raise
            return self._response(request, ticket, t_recv)
        except _Failure as exc:
            await context.abort(exc.code, str(exc))

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        """Requests admitted as they are read; each answered (or refused) by a message put on `out` by its
        ticket's notify, in this loop, as soon as its samples have left: no task per request."""
        await self._auth(context)
        out: asyncio.Queue = asyncio.Queue()
        tickets: set[Ticket] = set()
        reading = [True]

        def failed(req: Any, exc: _Failure) -> Any:
            return pb.ModelStreamInferResponse(error_message=f"{exc.code.name}: {exc}",
                                               infer_response=pb.ModelInferResponse(model_name=req.model_name,
                                                                                    id=req.id))

        def answered(req: Any, t_recv: float) -> Callable[[Ticket], None]:
            def notify(ticket: Ticket) -> None:
                tickets.discard(ticket)
                try:
                    out.put_nowait(pb.ModelStreamInferResponse(infer_response=self._response(req, ticket, t_recv)))
                except _Failure as exc:
                    out.put_nowait(failed(req, exc))
                if not reading[0] and not tickets:
                    out.put_nowait(None)
            return notify

        async def reader() -> None:
            async for req in request_iterator:
                try:
                    tickets.add(self._admit(req, answered(req, time.monotonic())))
                except _Failure as exc:
                    out.put_nowait(failed(req, exc))
            reading[0] = False
            if not tickets:
                out.put_nowait(None)

        rd = asyncio.ensure_future(reader())
        try:
            while True:
                item = await out.get()
                if item is None:
                    break
                yield item
        finally:                      # the client went away (or the stream ended): drop what is left
            if not rd.done():
                rd.cancel()
            for ticket in list(tickets):
                ticket.cancel()


async def start_grpc(server: Any, host: str, port: int) -> tuple[Any, int]:
    """A started grpc.aio server on host:port (TLS when the server has cert and key), and the port it bound
    (port 0: any free one)."""
    srv = grpc.aio.server(options=[("grpc.max_receive_message_length", 4 << 20)])
    pbg.add_GRPCInferenceServiceServicer_to_server(InferenceService(server), srv)
    addr = f"{host}:{port}"
    try:
        if server.tls:
            cert, key = server.tls
            creds = grpc.ssl_server_credentials([(open(key, "rb").read(), open(cert, "rb").read())])
            bound = srv.add_secure_port(addr, creds)
        else:
            bound = srv.add_insecure_port(addr)
    except RuntimeError:                   # grpcio >= 1.50 raises where older ones returned 0
        bound = 0
    if not bound:
        raise FluidError(f"cannot bind gRPC on {addr} (the port in use, or not an address of this machine)")
    await srv.start()
    return srv, int(bound)
