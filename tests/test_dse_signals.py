"""The DSE stops on Ctrl-C and SIGTERM: its forked workers are killed, none is left running, and the
KeyboardInterrupt reaches the caller (the CLI turns it into one line and exit 130)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

# a search large enough to run for many seconds, its spaces forced into the fork pool, behind the progress
# bar `fluidnpu dse` and `fluidnpu flow` show (which must not swallow or delay the interrupt)
CHILD = textwrap.dedent("""
    import sys
    from fluidnpu.boards import load_board
    from fluidnpu.design import explore_with_progress
    from fluidnpu.dse import search
    from fluidnpu.zoo import zoo_model

    search.PARALLEL_DESIGNS = 0
    try:
        explore_with_progress(zoo_model("resnet50"), load_board("zc706"), search.DSEOptions(bmax=8))
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
    print("finished", flush=True)
""")


def children(pid: int) -> set[int]:
    """The live (not zombie) processes whose parent is `pid`, from /proc."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.add(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists() or (len(os.sched_getaffinity(0)) < 2),
                    reason="needs /proc and two cores (the fork pool)")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_search_stops_on_signal_and_leaves_no_worker(sig):
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        workers: set[int] = set()
        while len(workers) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
            workers = children(proc.pid)
        assert len(workers) >= 2, f"the search never started its workers: {proc.communicate()}"
        time.sleep(0.3)   # the workers inside their spaces
        sent = time.monotonic()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=10)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert (proc.returncode, out.strip()) == (130, "interrupted"), err
    assert took < 2.0, f"the search took {took:.1f} s to stop"
    assert not [pid for pid in workers if alive(pid)], "a pool worker outlived the search"
