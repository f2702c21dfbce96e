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
from typing import Any, AsyncIterator

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from fluidnpu.errors import FluidError
from fluidnpu.serving.engine import Rejected
from fluidnpu.serving.protocol import (DEADLINE_PARAM, BadRequest, NotFound, deadline_s, output_arrays,
                                       timing_params)

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
        T = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(name=m["name"], versions=m["versions"], platform=m["platform"],
                                        inputs=[T(**t) for t in m["inputs"]], outputs=[T(**t) for t in m["outputs"]])

    # ---- inference ----------------------------------------------------------------------------
    async def _infer(self, request: Any) -> Any:
        """One request's response; raises _Failure with the status code of a refusal."""
        t_recv = time.monotonic()
        try:
            self.model.check_name(request.model_name, request.model_version)
            if len(request.inputs) != 1:
                raise BadRequest("the request needs exactly one input tensor")
            t = request.inputs[0]
            if request.raw_input_contents:
                if len(request.raw_input_contents) != 1:
                    raise BadRequest("one raw_input_contents entry per input expected")
                data: Any = request.raw_input_contents[0]
            else:
                data = list(t.contents.fp32_contents)
            x = self.model.check_input(t.name, t.datatype, list(t.shape), data)
            p = request.parameters.get(DEADLINE_PARAM)
            deadline = deadline_s(None if p is None else _param(p), self.engine.slo_s)
            names = self.model.check_outputs([o.name for o in request.outputs])
        except NotFound as exc:
            raise _Failure(grpc.StatusCode.NOT_FOUND, str(exc)) from None
        except BadRequest as exc:
            raise _Failure(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        try:
            futs = [self.engine.submit(xi, deadline) for xi in x]
        except Rejected as exc:
            code = grpc.StatusCode.RESOURCE_EXHAUSTED if exc.reason == "deadline" else grpc.StatusCode.UNAVAILABLE
            raise _Failure(code, f"rejected ({exc.reason}): {exc}") from None
        except FluidError as exc:
            raise _Failure(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        try:
            results = await asyncio.gather(*[asyncio.wrap_future(f) for f in futs])
        except asyncio.CancelledError:
            for f in futs:
                f.cancel()
            raise
        errors = [r.error for r in results if r.error]
        if errors:
            raise _Failure(grpc.StatusCode.INTERNAL, f"device error: {errors[0]}")
        arrays = output_arrays(results, self.model.n_classes)
        resp = pb.ModelInferResponse(model_name=self.model.name, model_version=self.model.version, id=request.id)
        for k, v in timing_params(results, t_recv, time.monotonic(), deadline).items():
            if isinstance(v, bool):
                resp.parameters[k].bool_param = v
            else:
                resp.parameters[k].double_param = float(v)
        for name in names:
            a = arrays[name]
            resp.outputs.add(name=name, datatype=_DT[a.dtype], shape=list(a.shape))
            resp.raw_output_contents.append(a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())
        return resp

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        await self._auth(context)
        try:
            return await self._infer(request)
        except _Failure as exc:
            await context.abort(exc.code, str(exc))

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        await self._auth(context)
        out: asyncio.Queue = asyncio.Queue()
        pending: set[asyncio.Task] = set()

        async def one(req: Any) -> None:
            try:
                out.put_nowait(pb.ModelStreamInferResponse(infer_response=await self._infer(req)))
            except _Failure as exc:
                out.put_nowait(pb.ModelStreamInferResponse(
                    error_message=f"{exc.code.name}: {exc}",
                    infer_response=pb.ModelInferResponse(model_name=req.model_name, id=req.id)))

        async def reader() -> None:
            async for req in request_iterator:
                task = asyncio.ensure_future(one(req))
                pending.add(task)
                task.add_done_callback(pending.discard)
            while pending:
                await asyncio.gather(*list(pending), return_exceptions=True)
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
            for task in list(pending):
                task.cancel()


async def start_grpc(server: Any, host: str, port: int) -> Any:
    """A started grpc.aio server on host:port (TLS when the server has cert and key)."""
    srv = grpc.aio.server(options=[("grpc.max_receive_message_length", 4 << 20)])
    pbg.add_GRPCInferenceServiceServicer_to_server(InferenceService(server), srv)
    addr = f"{host}:{port}"
    if server.tls:
        cert, key = server.tls
        creds = grpc.ssl_server_credentials([(open(key, "rb").read(), open(cert, "rb").read())])
        bound = srv.add_secure_port(addr, creds)
    else:
        bound = srv.add_insecure_port(addr)
    if not bound:
        raise FluidError(f"cannot bind gRPC on {addr}")
    await srv.start()
    return srv
