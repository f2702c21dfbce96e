"""Ctrl-C and SIGTERM stop a long command within a second or two: exit code 130, one line on stderr,
no worker process left behind and no output file half-written (the old one untouched).

These run the `fluidnpu` script in a subprocess of its own session, since signals are the point: the
signal is sent once the command has installed its handlers (SigCgt in /proc) and has worked a moment.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FLUIDNPU = str(Path(sys.executable).with_name("fluidnpu"))

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")


def _catches_sigterm(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


def _session(sid: int) -> list[int]:
    """Live processes of session `sid` (the command and anything it started)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                pids.append(int(entry.name))
    return pids


def interrupt(args: list[str], sig: signal.Signals, cwd: Path, after_s: float = 1.5) -> tuple[int, float, str]:
    """Run `fluidnpu ARGS`, send `sig` `after_s` seconds after its handlers are in; return the exit code,
    the seconds from the signal to the exit, and stderr. Fails if a process of its session outlives it."""
    proc = subprocess.Popen([FLUIDNPU, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not _catches_sigterm(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(after_s)
        assert proc.poll() is None, f"{args} ended before the signal: {proc.returncode}"
        sent = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=10)
        took = time.monotonic() - sent
        left = _session(proc.pid)
        for _ in range(20):  # a worker that got its signal may need a moment to go
            if not left:
                break
            time.sleep(0.05)
            left = _session(proc.pid)
        assert not left, f"{args}: processes left behind: {left}"
        return proc.returncode, took, err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _assert_stopped(code: int, took: float, err: str) -> None:
    assert code == 130 and took < 3.0, (code, took, err)
    assert err.splitlines() == ["interrupted: stopped, no output file left half-written"], err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_dse_stops_and_leaves_the_old_bundle_untouched(tmp_path, sig):
    """Inception-v3 on ZC706 searches for ~20 s in forked workers: they must go with it."""
    old = tmp_path / "d.json"
    old.write_text("the old bundle")
    _assert_stopped(*interrupt(["dse", "-m", "inceptionv3", "-b", "zc706", "-o", str(old)], sig, tmp_path))
    assert old.read_text() == "the old bundle"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.json"]


@pytest.mark.parametrize("args", [
    ["eval", "fig4", "--out", "ev", "--no-plots"],
    ["flow", "--out", "fl"],
    ["run", "--rate", "10", "--slo", "100", "--samples", "5000"],
], ids=["eval", "flow", "run"])
def test_long_commands_stop_on_sigterm_and_write_nothing(tmp_path, args):
    _assert_stopped(*interrupt(args, signal.SIGTERM, tmp_path))
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_simulate_stops_on_sigint(tmp_path, tiny_board, tiny_workload):
    """A long simulation (a million samples a seed) on a tiny design: Ctrl-C ends it in one line."""
    from fluidnpu.bundle import bundle_from_result
    from fluidnpu.dse.search import DSEOptions, explore

    bundle_from_result(explore(tiny_workload, tiny_board, DSEOptions(bmax=4))).save(tmp_path / "tiny.json")
    args = ["simulate", "--design", "tiny.json", "-p", "fluidb", "--rate", "50", "--slo", "100",
            "--samples", "1000000", "--seeds", "5", "--json"]
    _assert_stopped(*interrupt(args, signal.SIGINT, tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.json"]
