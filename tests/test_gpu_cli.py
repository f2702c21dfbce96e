"""`fluidnpu gpu bench` on CPU, its one-line errors, and torch staying optional."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fluidnpu.errors import FluidError


class _R:
    def __init__(self, rc, out, err):
        self.returncode, self.stdout, self.stderr = rc, out, err


def _run(*args):
    """The CLI in this process (torch is imported once per session), as exit code, stdout, stderr."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from fluidnpu import cli

    out, err = io.StringIO(), io.StringIO()
    rc = 0
    old = cli.err
    cli.err = cli.Console(file=err, width=200)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            cli.main(list(args))
    except SystemExit as exc:
        rc = exc.code or 0
    finally:
        cli.err = old
    return _R(rc, out.getvalue(), err.getvalue())


def test_core_cli_does_not_import_torch():
    r = subprocess.run([sys.executable, "-c", "import sys, fluidnpu.cli, fluidnpu.scheduler_fw.gpu.cli, "
                        "fluidnpu.host_driver.staged.engine; assert 'torch' not in sys.modules"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_missing_torch_is_one_line_error(monkeypatch):
    from fluidnpu.host_driver.staged.torchutil import require_torch

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(FluidError, match="PyTorch is not installed"):
        require_torch()


def test_bench_json_on_cpu():
    pytest.importorskip("torch")
    r = _run("gpu", "bench", "--workload", "cnn", "--policy", "dva", "--load", "100", "--device", "cpu",
             "--duration", "0.2", "--bsmax", "8", "--threads", "1", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["sent"] == d["answered"] > 0 and d["failed"] == 0
    for k in ("mean_latency_ms", "p99_latency_ms", "throughput_qps", "overhead_per_stage_ms", "gpu"):
        assert k in d


def test_bench_errors_exit_2():
    pytest.importorskip("torch")
    import torch

    if not torch.cuda.is_available():
        r = _run("gpu", "bench", "-w", "cnn", "-p", "dva", "--device", "cuda", "--duration", "0.1")
        assert r.returncode == 2 and "no CUDA GPU" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = _run("gpu", "bench", "-w", "cnn", "-p", "dva", "--device", "cpu", "--load", "fast")
    assert r.returncode == 2 and "--load" in r.stderr
    r = _run("gpu", "bench", "-w", "cnn", "-p", "dp", "--device", "cpu", "--duration", "0.1")
    assert r.returncode == 2 and "variable-length" in r.stderr
    r = _run("gpu", "bench", "-w", "eecnn", "-p", "dva", "--device", "cpu", "--stages", "99", "--duration", "0.1",
             "--bsmax", "4")
    assert r.returncode == 2 and "more stages than modules" in r.stderr
    r = _run("gpu", "bench", "-w", "cnn", "-p", "dva", "--device", "cpu", "--stages", "many", "--duration", "0.1")
    assert r.returncode == 2 and "--stages" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_bench_stages_auto_searches_and_reports_the_tries():
    pytest.importorskip("torch")
    r = _run("gpu", "bench", "-w", "cnn", "-p", "dva", "--device", "cpu", "--stages", "auto", "--duration", "0.15",
             "--bsmax", "4", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    tried = [t["stages"] for t in d["stage_search"]]
    assert 2 <= len(tried) <= 8 and tried == sorted(tried)
    assert len(d["stage_bounds"]) in tried and d["answered"] == d["sent"]
