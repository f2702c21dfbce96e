"""What the serving tests share: ports on 127.0.0.1 and `fluidnpu serve` started in a subprocess."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

CLI = [sys.executable, "-m", "fluidnpu.cli"]


def free_port() -> int:
    """A port nothing listens on now (the OS's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def busy_port() -> Iterator[int]:
    """A port held open by a listening socket while the block runs."""
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        yield busy.getsockname()[1]


class ServeProcess:
    """`fluidnpu serve --device model` in a subprocess on a free gRPC port and an OS-chosen HTTP port;
    `info` is its start-up JSON line. `stderr`: where its log goes (a pipe by default)."""

    def __init__(self, *args: str, stderr: int | IO[str] = subprocess.PIPE, start_s: float = 120) -> None:
        self.grpc_port = free_port()
        cmd = [*CLI, "serve", "--device", "model", "--http-port", "0", "--grpc-port", str(self.grpc_port), *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True)
        line = [""]
        reader = threading.Thread(target=lambda: line.__setitem__(0, self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(start_s)
        if not line[0]:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"server did not start: {self.log()[-2000:]}")
        self.info = json.loads(line[0])
        self.http = f"127.0.0.1:{self.info['http_port']}"
        self.grpc = f"127.0.0.1:{self.grpc_port}"

    def log(self) -> str:
        """What the server wrote on stderr so far (all of it once it has exited, with a pipe)."""
        if self.proc.stderr is not None:
            return self.proc.stderr.read() if self.proc.poll() is not None else ""
        return ""
