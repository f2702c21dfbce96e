"""`fluidnpu serve` / `fluidnpu edge`: the NPU behind the KServe v2 (Open Inference) protocol.

engine.py owns the device and the one scheduler queue (pure Python + numpy,
board-side); protocol.py checks and encodes tensors for both transports;
http_api.py (Starlette) and grpc_api.py (grpcio with tritonclient's generated
stubs) are the transports; edge.py is the tritonclient swarm. The transports'
libraries are the `serve` extra and are imported only when a server starts.
"""
