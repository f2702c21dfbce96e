"""The serving engine: one device, one scheduler queue, many clients.

Every request from every transport (HTTP, gRPC, gRPC stream) is split into
its samples, and each sample enters the **one** `RequestQueue` of the serving
loop of `fluidnpu run` (scheduler_fw/serving.py `serve`), which runs in a
thread on a `WallClock` with the chosen policy (FluidB by default). So
samples of different edge devices batch together and leave at their exits.

The transports only see `ServingEngine.submit_request`, which admits all
samples of one request (a `Ticket`, answered once its last sample has left
the network, or with a device error) or none, raising `Rejected` with a
reason: `queue_full` (the bounded admission queue, `--max-queue`),
`deadline` (the predicted completion, from the measured service time, the
samples ahead and the transports' measured overhead, is past the request's
deadline; or the samples in flight are at the limit that admitted requests'
missed deadlines lower and met ones raise), `draining` (SIGTERM). Every sample
ends answered or rejected; `counters` add up (`check_counters`).

Answers go back to the transports' asyncio loop in one hand-off per device
run (one `call_soon_threadsafe` for every request a run completed), not one
wake-up of the loop per sample: under load the loop's wake-ups cost more than
the answers. `submit` is the one-sample, `concurrent.futures` form for
in-process use.

A client that goes away leaves its samples to run; their results are
dropped when they come back (`dropped`), nothing else is affected.

Board-side code: numpy + the host driver; no server library is imported here.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fluidnpu.errors import FluidError
from fluidnpu.scheduler_fw.device_backend import DeviceBackend, Request
from fluidnpu.scheduler_fw.serving import ArrivalSource, Clock, WallClock, serve


class Rejected(Exception):
    """A sample the engine will not admit; `reason` is one of REASONS."""

    REASONS = ("queue_full", "deadline", "draining")

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class SampleResult:
    """What the engine hands back for one sample."""

    pred: int
    exit: int
    logits: np.ndarray
    arrival: float                 # time.monotonic() at admission
    done: float                    # time.monotonic() when its exit was decided
    error: str | None = None

    @property
    def latency_s(self) -> float:
        return self.done - self.arrival


class QueueSource(ArrivalSource):
    """Arrivals pushed by client threads; `close()` ends the loop once everything admitted has left."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._items: list[tuple[float, Any]] = []
        self.closed = False

    def push(self, payloads: list[Any], t: float) -> None:
        """Arrivals of one request, all at time `t` (time.monotonic())."""
        with self._cv:
            self._items.extend((t, p) for p in payloads)
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self.closed = True
            self._cv.notify()

    def poll(self, now: float) -> list[tuple[float, Any]]:
        with self._cv:
            items, self._items = self._items, []
        return items

    def wait(self, clock: Clock, until: float | None) -> bool:
        with self._cv:
            if self._items:
                return True
            if until is None:
                if self.closed:
                    return False
                self._cv.wait()
            else:
                dt = until - time.monotonic()
                if dt > 0:
                    self._cv.wait(dt)
        return True


@dataclass(eq=False)
class Ticket:
    """One client request: its samples' results, filled in as they leave; `notify(ticket)` runs once the
    last one has, in `loop` (an asyncio loop: one hand-off per device run) or, without one, in the
    scheduler thread. `cancel()` when the client went away: the results are dropped."""

    n: int
    notify: Callable[[Ticket], None]
    loop: Any = None
    deadline_s: float = 0.0
    predicted_s: float = 0.0          # admission's queue estimate (admission to exit), for its calibration
    results: list[SampleResult | None] = field(default_factory=list)
    left: int = 0
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass(eq=False)
class _Pending(Request):
    """A `Request` of the device backend: one sample of a `Ticket`."""

    ticket: Ticket | None = None
    slot: int = 0
    arrival: float = 0.0


class _ServingBackend(DeviceBackend):
    """DeviceBackend that answers each sample the moment its exit is decided (not in arrival order), and
    with `pace_hz` holds each run for the device's modelled cycles at the board clock."""

    def __init__(self, runtime: Any, table: Any, engine: ServingEngine, pace_hz: float | None) -> None:
        super().__init__(runtime, table)
        self.engine = engine
        self.pace_hz = pace_hz

    def run(self, start: int, stop: int, batch: Any) -> Any:
        t0 = time.perf_counter()
        cyc0 = self.runtime.device_cycles
        res = super().run(start, stop, batch)
        if self.pace_hz:
            hold = (self.runtime.device_cycles - cyc0) / self.pace_hz - (time.perf_counter() - t0)
            if hold > 0:
                time.sleep(hold)
                res.seconds = time.perf_counter() - t0
        self.engine._on_run(len(batch), res)
        now = time.monotonic()
        for smp, ex, _ in res.exited:
            self.engine._answer(smp.payload, ex, now)
        self.engine._hand_off()
        return res


class ServingEngine:
    """One device and one scheduler behind `submit_request` (see the module docstring)."""

    # admission calibrates its estimate on the last CALIB_WINDOW answered requests, at their median: the
    # transports' typical share; the tail is the in-flight limit's business
    CALIB_WINDOW = 512
    CALIB_QUANTILE = 50.0
    # the in-flight limit: -1 per admitted request that missed its deadline, +MISS_TARGET/(1 - MISS_TARGET)
    # per one that met it, so it settles where MISS_TARGET of admitted requests miss: half the 1 % a p99
    # within the deadline allows, for a margin
    MISS_TARGET = 0.005

    def __init__(self, runtime: Any, table: Any, policy: Any, *, slo_s: float, max_queue: int,
                 pace_hz: float | None = None, metrics: Any = None) -> None:
        if max_queue < 1:
            raise FluidError(f"--max-queue must be >= 1, got {max_queue}")
        self.runtime, self.table, self.policy = runtime, table, policy
        self.slo_s, self.max_queue = slo_s, int(max_queue)
        self.backend = _ServingBackend(runtime, table, self, pace_hz)
        self.source = QueueSource()
        self.metrics = metrics
        self._lock = threading.Lock()
        self.inflight = 0
        self.counters: Counter[str] = Counter()
        self.exits: Counter[int] = Counter()
        self.draining = False
        self._waiting: set[_Pending] = set()
        self._ready: list[Ticket] = []              # completed in the current run, not yet handed off
        self._thread: threading.Thread | None = None
        self.running = False
        self.loop_error: BaseException | None = None
        self.report: Any = None
        # the longest a lone sample can take (every segment: it may leave at the last exit; the exit is not
        # known at admission, and on a slow board a first-exit estimate admits what the last exit then misses)
        # and the device time per sample at full batches
        last, self._bmax = table.n_segments - 1, table.bmax
        self._path_s = [table.span(0, last, b) for b in range(1, self._bmax + 1)]   # index b - 1
        self._seg0_full_s = table.span(0, 0, self._bmax)
        self._full_batch_s = 1.0 / table.full_batch_capacity()
        # measured wall time per answered sample while busy (the table does not see the transports' share of
        # the CPU): admission uses the larger of the two
        self._svc_s = 0.0
        self._busy_since: float | None = None
        self._acc_s, self._acc_n = 0.0, 0
        # calibration: the server's measured time per request over admission's queue estimate
        self._residuals: list[float] = []
        self.calib_residual_s = 0.0
        self.limit = float(self.max_queue)

    # ---- life cycle ---------------------------------------------------------------------------
    def start(self) -> ServingEngine:
        """Run the scheduler loop in a thread of its own (in-process use); `drain()` stops it."""
        self._thread = threading.Thread(target=self.run, name="fluidnpu-scheduler", daemon=True)
        self._thread.start()
        return self

    def run(self) -> None:
        """The scheduler loop, in the calling thread, until `begin_drain()` and the last admitted sample
        left. The device is only ever touched from this thread (the RTL simulation needs that)."""
        self.running = True
        try:
            self.report = serve(self.policy, self.backend, self.source, WallClock())
        except BaseException as exc:                      # the loop died: fail everyone waiting, never hang
            self.loop_error = exc
            with self._lock:
                self.draining = True
            for p in list(self._waiting):
                self._finish(p, None, f"scheduler stopped: {type(exc).__name__}: {exc}", time.monotonic())
            self._hand_off()
        finally:
            self.running = False

    def begin_drain(self) -> None:
        """Stop admitting; the loop ends once every admitted sample has left."""
        with self._lock:
            self.draining = True
        self.source.close()

    def drain(self, timeout_s: float = 30.0) -> bool:
        """`begin_drain()` and wait for the loop started by `start()`. True if it drained in time."""
        self.begin_drain()
        if self._thread is not None:
            self._thread.join(timeout_s)
            return not self._thread.is_alive()
        return True

    @property
    def ready(self) -> bool:
        return self.running and not self.draining

    # ---- admission ----------------------------------------------------------------------------
    def check_room(self, n: int = 1) -> None:
        """`Rejected` (draining, queue_full) if `n` samples could not be admitted now: the transports ask
        before decoding a request, so that a flood is refused at the least cost."""
        if self.draining or self.inflight + n > self.max_queue:
            with self._lock:
                self._refuse(n)

    def _refuse(self, n: int) -> None:
        if self.draining:
            self._reject("draining", "the server is shutting down")
        if self.inflight + n > self.max_queue:
            self._reject("queue_full", f"admission queue full ({self.inflight} of {self.max_queue} samples "
                                       f"in flight, {n} more asked)")

    def predicted_s(self, n: int = 1) -> tuple[float, float]:
        """Admission's estimate for a request of `n` samples: (admission to its last exit from the queue
        alone: one sample's whole path plus every sample ahead and its own at the measured service time, or,
        if longer, the batches of Bmax ahead through the first segment and its own batch's whole path; the
        whole time in the server: that plus the measured residual, at CALIB_QUANTILE of the last requests,
        of the server's time over that estimate: the transports' share and the CPU the estimate misses)."""
        k = self.inflight + n
        q = self._path_s[0] + (k - 1) * max(self._full_batch_s, self._svc_s)
        # the same queue served in batches of Bmax: the batches ahead each hold the first segment, then the
        # request's own batch runs its whole path (on a slow board this, not the throughput, sets the tail)
        batched = (-(-k // self._bmax) - 1) * self._seg0_full_s + self._path_s[min(k, self._bmax) - 1]
        q = max(q, batched)
        return q, q + self.calib_residual_s

    def submit_request(self, xs: np.ndarray, deadline_s: float | None, notify: Callable[[Ticket], None],
                       loop: Any = None) -> Ticket:
        """Admit every sample of `xs` (N, H, W, C) or none: `Rejected` with a reason, FluidError if malformed.
        `notify(ticket)` runs once all have left (in `loop` when given, else in the scheduler thread)."""
        deadline = self.slo_s if deadline_s is None else deadline_s
        n = len(xs)
        with self._lock:
            self._refuse(n)
            raw, est = self.predicted_s(n)
            # nothing in flight: admitted whatever the estimate says (the fastest it can be; its
            # measurement keeps the calibration current when a burst made the estimate pessimistic)
            if self.inflight and est > deadline:
                self._reject("deadline", f"deadline {deadline * 1e3:.2f} ms cannot be met: {self.inflight} "
                                         f"samples ahead, predicted {est * 1e3:.2f} ms")
            if self.inflight and self.inflight + n > self.limit:
                self._reject("deadline", f"deadline {deadline * 1e3:.2f} ms at risk: {self.inflight} samples "
                                         f"ahead, at the in-flight limit ({self.limit:.1f}) that admitted "
                                         f"requests' missed deadlines set")
            states = self.runtime.new_samples(xs)      # FluidError on a bad input: nothing admitted
            t = Ticket(n, notify, loop, deadline, raw, [None] * n, n)
            base = self.counters["admitted"]
            ps = [_Pending(index=base + i, state=st, ticket=t, slot=i) for i, st in enumerate(states)]
            self.inflight += n
            self.counters["admitted"] += n
            self._waiting.update(ps)
            if self.metrics:
                self.metrics.admitted.inc(n)
                self.metrics.queue_depth.set(self.inflight)
        # the arrival is set before the samples are visible: the scheduler thread may run and answer them
        # before push returns
        arrival = time.monotonic()
        for p in ps:
            p.arrival = arrival
        self.source.push(ps, arrival)
        return t

    def submit(self, x: np.ndarray, deadline_s: float | None = None) -> cf.Future:
        """One float sample (H, W, C): a future of its SampleResult, answered in the scheduler thread."""
        fut: cf.Future = cf.Future()

        def notify(t: Ticket) -> None:
            if fut.set_running_or_notify_cancel():
                fut.set_result(t.results[0])

        self.submit_request(np.asarray(x)[None], deadline_s, notify)
        return fut

    def _reject(self, reason: str, message: str) -> None:
        """Count one refused request (admitted and answered count samples) and raise."""
        self.counters[f"rejected_{reason}"] += 1
        if self.metrics:
            self.metrics.rejected.labels(reason).inc()
        raise Rejected(reason, message)

    def note_response(self, ticket: Ticket, server_s: float) -> None:
        """The transports sent `ticket`'s response `server_s` after receiving the request: the residual
        over admission's queue estimate calibrates the next admissions (`predicted_s`), and a missed or
        met deadline moves the in-flight limit (`limit`)."""
        with self._lock:
            if server_s > ticket.deadline_s:
                self.limit = max(1.0, self.limit - 1.0)
            else:
                self.limit = min(float(self.max_queue), self.limit + self.MISS_TARGET / (1 - self.MISS_TARGET))
            self._residuals.append(server_s - ticket.predicted_s)
            if len(self._residuals) % 32 == 0:
                self._residuals = self._residuals[-self.CALIB_WINDOW:]
                self.calib_residual_s = max(0.0, float(np.percentile(self._residuals, self.CALIB_QUANTILE)))

    # ---- results (scheduler thread) -----------------------------------------------------------
    def _on_run(self, b: int, res: Any) -> None:
        now = time.monotonic()
        n = len(res.exited)
        with self._lock:
            if self._busy_since is not None:
                self._acc_s += now - self._busy_since
                self._acc_n += n
                if self._acc_n >= 16:
                    est = self._acc_s / self._acc_n
                    self._svc_s = 0.7 * self._svc_s + 0.3 * est if self._svc_s else est
                    self._acc_s, self._acc_n = 0.0, 0
            self._busy_since = now if self.inflight > n else None
        if self.metrics:
            self.metrics.batch.observe(b)
            self.metrics.busy.inc(res.seconds)
            self.metrics.preemptions.set(self.policy.preemptions)

    def _answer(self, p: _Pending, ex: int, now: float) -> None:
        st = p.state
        self._finish(p, SampleResult(int(st.pred) if st.pred is not None else -1, int(ex),
                                     np.asarray(st.logits if st.logits is not None else [], dtype=np.float32),
                                     p.arrival, now, p.error), p.error, now)

    def _finish(self, p: _Pending, result: SampleResult | None, error: str | None, now: float) -> None:
        if result is None:
            result = SampleResult(-1, -1, np.zeros(0, np.float32), p.arrival, now, error)
        t = p.ticket
        with self._lock:
            if p not in self._waiting:
                return
            self._waiting.discard(p)
            self.inflight -= 1
            p.answered += 1
            self.counters["errors" if error else "answered"] += 1
            if not error:
                self.exits[result.exit] += 1
            if self.metrics:
                self.metrics.queue_depth.set(self.inflight)
                if error:
                    self.metrics.errors.inc()
                else:
                    self.metrics.exits.labels(str(result.exit)).inc()
                    self.metrics.latency.observe(result.latency_s)
            if t is None:
                return
            t.results[p.slot] = result
            t.left -= 1
            if t.left:
                return
            if t.cancelled:                                  # the client went away
                self.counters["dropped"] += t.n
                return
            self._ready.append(t)

    def _hand_off(self) -> None:
        """Notify the requests the last run completed: in the scheduler thread for those without a loop,
        and one `call_soon_threadsafe` per loop for the rest."""
        with self._lock:
            ready, self._ready = self._ready, []
        by_loop: dict[Any, list[Ticket]] = {}
        for t in ready:
            if t.loop is None:
                t.notify(t)
            else:
                by_loop.setdefault(t.loop, []).append(t)
        for loop, ts in by_loop.items():
            try:
                loop.call_soon_threadsafe(_notify_all, ts)
            except RuntimeError:                             # the loop has closed: nobody is waiting
                pass

    def check_counters(self) -> dict[str, int]:
        """The counters, after asserting admitted = answered + errors + in flight."""
        with self._lock:
            c = dict(self.counters)
            if c.get("admitted", 0) != c.get("answered", 0) + c.get("errors", 0) + self.inflight:
                raise RuntimeError(f"serving counters do not add up: {c}, {self.inflight} in flight")
            return c | {"inflight": self.inflight}


def resolves(fut: Any) -> Callable[[Ticket], None]:
    """A ticket's `notify` that resolves the asyncio future `fut` (of the ticket's loop) with the ticket."""
    def notify(t: Ticket) -> None:
        if not fut.done():
            fut.set_result(t)
    return notify


def _notify_all(tickets: list[Ticket]) -> None:
    for t in tickets:
        if not t.cancelled:
            t.notify(t)
