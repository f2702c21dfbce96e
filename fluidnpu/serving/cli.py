"""`fluidnpu serve` and `fluidnpu edge` (registered by fluidnpu/cli.py through `commands`).

Only click is imported here; the server and client libraries (the `serve`
extra) are imported when a command runs.
"""

from __future__ import annotations

from typing import Any

import click

from fluidnpu.output import FloatRange

# bounds that keep a huge or infinite number from reaching a timer, an array size or a thread count
_MS = FloatRange(min=0, min_open=True, max=1e7)              # deadlines and SLOs: up to ~3 h
_S = FloatRange(min=0, min_open=True, max=1e6)               # durations and timers: up to ~11 days
_PORT = click.IntRange(0, 65535)

@click.command("serve", short_help="Serve the NPU (or a fleet, --fleet) over KServe v2 to edge devices.")
@click.option("--device", type=click.Choice(["model", "rtl", "pynq", "devmem"]), default="model", show_default=True,
              help="model: bit-accurate numpy NPU; rtl: Verilator sim; pynq: flash --bitstream; devmem: UIO")
@click.option("--model", "-m", default="digits-ee", show_default=True, help="runtime model")
@click.option("--design", type=click.Path(dir_okay=False), default=None, help="design bundle (required on a board)")
@click.option("--bitstream", type=click.Path(dir_okay=False), default=None, help="npu.bit (--device pynq)")
@click.option("--uio", default="/dev/uio0", show_default=True, help="the NPU's UIO device (--device devmem)")
@click.option("--policy", "-p", default="fluidb", show_default=True, help="scheduling policy")
@click.option("--slo", type=_MS, default=50.0, show_default=True, help="default per-request deadline (ms)")
@click.option("--max-queue", type=click.IntRange(1, 1 << 20), default=64, show_default=True,
              help="samples admitted and not yet answered")
@click.option("--tau", type=FloatRange(0, 1, min_open=True), default=0.8, show_default=True,
              help="exit threshold on softmax top-1")
@click.option("--bmax", type=click.IntRange(1, 4096), default=None, help="largest batch (default: the design's)")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind")
@click.option("--http-port", type=_PORT, default=8000, show_default=True, help="HTTP port (0: any free port)")
@click.option("--grpc-port", type=_PORT, default=8001, show_default=True, help="gRPC port (0: any free port)")
@click.option("--token-file", type=click.Path(dir_okay=False), default=None, help="bearer token required")
@click.option("--tls-cert", type=click.Path(dir_okay=False), default=None, help="TLS certificate (PEM)")
@click.option("--tls-key", type=click.Path(dir_okay=False), default=None, help="TLS key (PEM)")
@click.option("--pace", type=click.Choice(["board"]), default=None,
              help="hold each run for the board's modelled time (ModelDevice on a PC)")
@click.option("--stop-after", type=_S, default=None,
              help="drain and exit after this many seconds (scripts; --device rtl, where SIGTERM cannot reach it)")
@click.option("--fleet", "fleet_path", type=click.Path(dir_okay=False), default=None,
              help="serve a fleet (with --sessions): the `fluidnpu plan` fleet file; needs the 'fleet' extra")
@click.option("--sessions", "sessions_path", type=click.Path(dir_okay=False), default=None,
              help="with --fleet: the sessions file (model, rate, SLO) the fleet is planned for")
@click.option("--address", default=None, help="with --fleet: join this Ray cluster instead of starting a local one")
@click.option("--epoch", "epoch_s", type=FloatRange(0, 1e6), default=None,
              help="with --fleet: re-plan every this many seconds on the measured rates (default 5; 0: only "
                   "when a device dies)")
@click.option("--json", "as_json", is_flag=True, help="print the final counters as JSON on exit")
@click.pass_context
def serve_cmd(ctx: click.Context, device: str, model: str, design: str | None, bitstream: str | None, uio: str,
              policy: str, slo: float, max_queue: int, tau: float, bmax: int | None, host: str, http_port: int,
              grpc_port: int, token_file: str | None, tls_cert: str | None, tls_key: str | None,
              pace: str | None, stop_after: float | None, fleet_path: str | None,
              sessions_path: str | None, address: str | None, epoch_s: float | None, as_json: bool) -> None:
    """Own one device and one scheduler queue; answer the Open Inference protocol until SIGTERM.

    With --fleet and --sessions: the Nexus plan of the sessions over the fleet, on Ray, behind one KServe v2
    HTTP endpoint (a Ray Serve deployment; docs/fleet.md)."""
    from fluidnpu.errors import FluidError
    from fluidnpu.output import emit_json, err
    from fluidnpu.serving.server import serve_command

    if fleet_path or sessions_path:
        if not (fleet_path and sessions_path):
            raise FluidError("--fleet and --sessions go together")
        one_device = [f"--{n.replace('_', '-')}" for n in ("device", "model", "design", "bitstream", "uio", "policy",
                                                           "slo", "max_queue", "bmax", "grpc_port", "token_file",
                                                           "tls_cert", "tls_key", "pace")
                      if ctx.get_parameter_source(n) is not click.core.ParameterSource.DEFAULT]
        if one_device:
            raise FluidError(f"{', '.join(one_device)}: one device's options; with --fleet the fleet file names "
                             f"the devices and the sessions file the models and SLOs")
        from fluidnpu.serving.fleet import serve_fleet_command

        try:
            rep = serve_fleet_command(fleet_path=fleet_path, sessions_path=sessions_path, address=address,
                                      epoch_s=5.0 if epoch_s is None else epoch_s, host=host, http_port=http_port,
                                      stop_after_s=stop_after, tau=tau)
        except OSError as exc:
            raise FluidError(f"cannot serve the fleet: {exc}") from None
        if as_json:
            emit_json(rep)
        else:
            err.print(_drained("drained", rep["counters"], ("requests", "answered", "retried", "errors"))
                      + f"; devices lost {len(rep['dead'])}")
        return
    if address is not None or epoch_s is not None:
        raise FluidError("--address and --epoch are options of a fleet (--fleet F.json --sessions S.json)")
    try:
        rep = serve_command(device=device, design=design, bitstream=bitstream, model=model, policy=policy,
                            slo_ms=slo, max_queue=max_queue, tau=tau, bmax=bmax, host=host, http_port=http_port,
                            grpc_port=grpc_port, token_file=token_file, tls_cert=tls_cert, tls_key=tls_key,
                            pace=pace, uio=uio, stop_after_s=stop_after)
    except ModuleNotFoundError as exc:
        raise FluidError(f"`fluidnpu serve` needs {exc.name}: pip install 'fluidnpu[serve]'") from None
    except OSError as exc:
        raise FluidError(f"cannot serve: {exc}") from None
    if as_json:
        emit_json(rep)
    else:
        err.print(_drained(f"drained in {rep['drained_s']:.2f} s", rep["counters"], ("admitted", "answered", "errors")))


def _drained(head: str, c: dict[str, int], counts: tuple[str, ...]) -> str:
    """The line a server prints when it has drained: its counters, the refusals by reason."""
    return f"{head}: " + ", ".join(f"{k} {c.get(k, 0)}" for k in counts) + ", " + _rejected(
        {k[len("rejected_"):]: v for k, v in c.items() if k.startswith("rejected_")})


def _rejected(by_reason: dict[str, int]) -> str:
    """'rejected 0', or 'rejected 7 (queue full 5, deadline 2)': refusals in plain words."""
    n = sum(by_reason.values())
    why = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in sorted(by_reason.items()) if v)
    return f"rejected {n}" + (f" ({why})" if why else "")


def _host_port(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--url as HOST:PORT: a value without a port can only fail every request, so it is bad input."""
    if value is None:
        return None
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(f"must be HOST:PORT with a port in 1..65535, got {value!r}")
    return value


@click.command("edge", short_help="A swarm of simulated edge devices streaming the test split to a server.")
@click.option("--url", default=None, callback=_host_port,
              help="server host:port (default 127.0.0.1:8000 for http, :8001 for gRPC)")
@click.option("--protocol", type=click.Choice(["http", "http-json", "grpc-stream"]), default="grpc-stream",
              show_default=True, help="http: binary tensors; http-json: pure JSON; grpc-stream: one stream per device")
@click.option("--devices", type=click.IntRange(1, 1024), default=4, show_default=True,
              help="edge devices (one client each)")
@click.option("--rate", type=FloatRange(min=0, min_open=True, max=1e6), default=200.0, show_default=True,
              help="total mean requests/s")
@click.option("--pattern", type=click.Choice(["poisson", "bursty"]), default="poisson", show_default=True)
@click.option("--duration", type=_S, default=5.0, show_default=True, help="seconds of sending")
@click.option("--model", "-m", default="digits-ee", show_default=True)
@click.option("--token-file", type=click.Path(dir_okay=False), default=None, help="bearer token to send")
@click.option("--deadline", type=_MS, default=None, help="per-request deadline (ms) sent to the server")
@click.option("--slo", type=_MS, default=50.0, show_default=True, help="SLO (ms) violations are counted against")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
def edge_cmd(url: str | None, protocol: str, devices: int, rate: float, pattern: str, duration: float,
             model: str, token_file: str | None, deadline: float | None, slo: float, seed: int,
             as_json: bool) -> None:
    """Send the test split from DEVICES edge devices at RATE requests/s for DURATION s; report what came back.

    Exits 1 when it did not do its job: a request failed (no server, a wrong token, a broken stream) or got
    no answer, or none was answered; requests the server refused with a reason (overload) are answers."""
    from fluidnpu.errors import FluidError
    from fluidnpu.output import emit_json, err, out
    from fluidnpu.serving.edge import failure, run_swarm
    from fluidnpu.serving.server import read_token

    token = read_token(token_file)
    url = url or ("127.0.0.1:8001" if protocol == "grpc-stream" else "127.0.0.1:8000")
    try:
        rep = run_swarm(url, protocol=protocol, devices=devices, rate=rate, duration_s=duration, pattern=pattern,
                        model=model, token=token, deadline_ms=deadline, slo_ms=slo, seed=seed)
    except ModuleNotFoundError as exc:
        raise FluidError(f"`fluidnpu edge` needs {exc.name}: pip install 'fluidnpu[serve]'") from None
    if as_json:
        emit_json(rep)
    else:
        _print_swarm(out, rep)
    why = failure(rep)
    if why:
        err.print(f"[bold red]edge failed:[/] {why}", highlight=False, soft_wrap=True)
        raise SystemExit(1)


def _print_swarm(console: Any, rep: dict[str, Any]) -> None:
    """The swarm's report in words and one small table (fits 80 columns)."""
    from rich.table import Table

    console.print(f"{rep['devices']} edge devices, {rep['protocol']}, {rep['pattern']} {rep['rate']:g} req/s "
                  f"for {rep['duration_s']:g} s", highlight=False)
    console.print(f"sent {rep['sent']}: answered {rep['answered']} ({rep['answered_per_s']:.1f}/s), "
                  f"{_rejected(rep['rejected_by_reason'])}, errors {rep['errors']}, lost {rep['lost']}",
                  highlight=False)
    if rep["answered"]:
        t = Table("latency (ms)", "p50", "p99", "max", box=None, pad_edge=False)
        for what, key in (("client (send to answer)", "latency_ms"), ("server (whole handling)", "server_latency_ms"),
                          ("queue to exit", "queue_to_exit_ms"), ("server overhead", "overhead_ms")):
            v = rep[key]
            t.add_row(what, *(f"{v[k]:.2f}" if v.get(k) is not None else "" for k in ("p50", "p99", "max")))
        console.print(t)
        exits = ", ".join(f"exit {k} {v}" for k, v in rep["exits"].items())
        console.print(f"accuracy {100 * rep['accuracy']:.2f} %; SLO {rep['slo_ms']:g} ms missed by "
                      f"{rep['slo_violations']} answers", highlight=False)
        console.print(f"samples by exit: {exits}", highlight=False)
    for m in rep["error_messages"]:
        console.print(f"  error: {m}", highlight=False, soft_wrap=False, overflow="ellipsis")


commands: list[Any] = [serve_cmd, edge_cmd]
