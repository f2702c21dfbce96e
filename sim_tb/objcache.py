#!/usr/bin/env python3
"""Verilator's OBJCACHE hook: its runtime library compiled once, not once a design.

Every Verilator build compiles the same runtime sources (verilated.cpp, verilated_vpi.cpp, ...,
18 s at -O0 on one core of the 2-core test machine) beside the design's own C++. sim_tb/runner.py
names this script as make's `OBJCACHE`, the prefix of every compile command, and
`FLUIDNPU_OBJCACHE_DIR` as its store. A command that compiles a source of Verilator's `include/`
directory is looked up by the command (less its output path), the source and Verilator's
configuration header; a hit copies the object and its dependency file, a miss compiles and keeps
them. Every other command runs as it is. Standard library only: make runs it with the system's
python3.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

STORE_ENV = "FLUIDNPU_OBJCACHE_DIR"


def _runtime_source(cmd: list[str]) -> tuple[Path, Path] | None:
    """(source, object) of a compile of a Verilator runtime source; None for any other command."""
    if "-c" not in cmd or "-o" not in cmd or cmd.index("-o") + 1 >= len(cmd):
        return None
    src, obj = Path(cmd[-1]), Path(cmd[cmd.index("-o") + 1])
    if src.suffix != ".cpp" or src.parent.name != "include" or not (src.parent / "verilated_config.h").is_file():
        return None
    return src, obj


def _key(cmd: list[str], src: Path) -> str:
    h = hashlib.sha256()
    out = cmd.index("-o") + 1
    for part in cmd[:out] + cmd[out + 1:]:
        h.update(part.encode() + b"\0")
    h.update(src.read_bytes())
    h.update((src.parent / "verilated_config.h").read_bytes())
    return h.hexdigest()[:32]


def _keep(path: Path, dest: Path) -> None:
    """Copy `path` to `dest` atomically (two builds may store the same object at once)."""
    fd, tmp = tempfile.mkstemp(dir=dest.parent, suffix=".tmp")
    os.close(fd)
    shutil.copyfile(path, tmp)
    os.replace(tmp, dest)


def main(argv: list[str]) -> int:
    cmd = argv[1:]
    store = os.environ.get(STORE_ENV)
    found = _runtime_source(cmd) if store else None
    if not cmd or found is None:
        return subprocess.call(cmd)
    src, obj = found
    dep = obj.with_suffix(".d")
    entry = Path(store) / _key(cmd, src)
    if entry.with_suffix(".o").is_file() and entry.with_suffix(".d").is_file():
        shutil.copyfile(entry.with_suffix(".o"), obj)
        shutil.copyfile(entry.with_suffix(".d"), dep)
        return 0
    rc = subprocess.call(cmd)
    if rc == 0 and obj.is_file() and dep.is_file():
        entry.parent.mkdir(parents=True, exist_ok=True)
        _keep(dep, entry.with_suffix(".d"))
        _keep(obj, entry.with_suffix(".o"))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
