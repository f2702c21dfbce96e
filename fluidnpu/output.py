"""Reading the user's files and writing the tool's: the one place that turns OS errors into one line.

Every command writes through `write_text`, `write_bytes`, `make_dir` or the `writing` context (plots,
CSV), and reads user files through `read_text` / `read_json`, so an unwritable output path, a
directory given for a file, a file without read permission, a symlink loop, an empty file or garbage
JSON all end as a FluidError (one line on stderr, exit code 2) naming the path and what is wrong,
never as a traceback. `emit_json` is the `--json` output of every command; `out` and `err` are the
consoles every command prints its tables and progress bars on.

Standard library and rich only: it runs on a board's ARM cores as well.
"""

from __future__ import annotations

import errno
import json
import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from fluidnpu.errors import FluidError

# The terminal's width when rich can find one (a terminal on either stream, or $COLUMNS), else 80, piped
# or not: tables fit what a person reads; whole machine-readable figures are what --json is for.
out = Console()
err = Console(stderr=True)


def emit_json(obj: Any) -> None:
    """Print a command's figures as JSON on stdout (what `--json` gives)."""
    sys.stdout.write(json.dumps(obj, indent=1) + "\n")
    sys.stdout.flush()


def progress_bar(console: Console, quiet: bool, label: str = "{task.description}") -> Any:
    """A rich progress bar on `console`, shown on a terminal only (`quiet`, e.g. --json, does not hide it
    there: it is on stderr). Rich cannot redraw a pipe or a file, where it would only leave an empty line."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=True, disable=not console.is_terminal)


_OS_REASONS = {
    errno.ELOOP: "a symbolic link loop",
    errno.EISDIR: "it is a directory, not a file",
    errno.ENOTDIR: "a part of the path is a file, not a directory",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOENT: "no such file or directory",
    errno.EROFS: "read-only file system",
    errno.ENOSPC: "no space left on the device",
}


def os_error_message(exc: OSError, path: str | os.PathLike[str], action: str) -> str:
    """'cannot <action> <path>: <reason>' in words a user can act on."""
    p = Path(exc.filename) if getattr(exc, "filename", None) else Path(path)
    reason = _OS_REASONS.get(exc.errno or 0) or exc.strerror or type(exc).__name__
    where = str(p) if str(p) == str(path) else f"{path} ({p})"
    return f"cannot {action} {where}: {reason}"


@contextmanager
def _os_errors(p: Path, action: str) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise FluidError(os_error_message(exc, p, action)) from None


def _prepare(p: Path) -> None:
    if p.is_dir():
        raise IsADirectoryError(errno.EISDIR, "Is a directory", str(p))
    p.parent.mkdir(parents=True, exist_ok=True)


@contextmanager
def writing(path: str | os.PathLike[str], what: str = "") -> Iterator[Path]:
    """Create `path`'s parent folders, then run the block that writes the path it yields; an OSError
    inside becomes a one-line FluidError. For writers that take a path (matplotlib's savefig, csv).

    The block writes a temporary file beside `path` (same suffix, so savefig picks the same format)
    that replaces `path` only when the block ends normally: an error or Ctrl-C part-way leaves the
    old file untouched, or none, never half a file. A target that exists and is not a regular
    file (/dev/stdout, a FIFO) is written in place."""
    p = Path(path)
    with _os_errors(p, f"write {what}" if what else "write"):
        _prepare(p)
        if p.exists() and not p.is_file():
            yield p
            return
        target = Path(os.path.realpath(p)) if p.is_symlink() else p
        tmp = target.with_name(f".{target.name}.partial-{os.getpid()}{target.suffix}")
        try:
            yield tmp
            if tmp.exists():
                os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)


def check_writable(path: str | os.PathLike[str], what: str = "") -> Path:
    """Fail now, in one line, if `path` cannot be written later (before minutes of work that would
    end in writing it): creates its parent folders and checks write permission there."""
    p = Path(path)
    with _os_errors(p, f"write {what}" if what else "write"):
        _prepare(p)
        if not os.access(p.parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
            raise PermissionError(errno.EACCES, "Permission denied", str(p))
    return p


def write_text(path: str | os.PathLike[str], text: str, what: str = "") -> Path:
    """Write `text` to `path` whole or not at all (see `writing`); one-line FluidError on any OS error."""
    with writing(path, what) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_bytes(path: str | os.PathLike[str], data: bytes, what: str = "") -> Path:
    """Write `data` to `path` whole or not at all (see `writing`); one-line FluidError on any OS error."""
    with writing(path, what) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def make_dir(path: str | os.PathLike[str], what: str = "output directory") -> Path:
    """Create the output folder `path` (and its parents) or say in one line why it cannot be."""
    p = Path(path)
    try:
        if p.exists() and not p.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "Not a directory", str(p))
        p.mkdir(parents=True, exist_ok=True)
        if not os.access(p, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "Permission denied", str(p))
    except OSError as exc:
        if exc.errno == errno.ENOTDIR and Path(exc.filename or "") == p:
            raise FluidError(f"cannot use {what} {p}: it is a file, not a directory") from None
        raise FluidError(os_error_message(exc, p, f"create {what}")) from None
    return p


def read_text(path: str | os.PathLike[str], what: str) -> str:
    """The text of the user's file `path` (`what`: e.g. 'design bundle'), or a one-line FluidError
    that says whether it is missing, a directory, unreadable, a symlink loop, empty or not text."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise FluidError(f"{what} {p}: not a text file (not UTF-8)") from None
    except FileNotFoundError:
        if p.is_symlink():
            raise FluidError(f"{what} {p}: a broken symbolic link (its target does not exist)") from None
        raise FluidError(f"{what} {p} does not exist") from None
    except OSError as exc:
        raise FluidError(os_error_message(exc, p, f"read {what}")) from None
    if not text.strip():
        raise FluidError(f"{what} {p} is empty")
    return text


def read_json(path: str | os.PathLike[str], what: str) -> Any:
    """The parsed JSON of the user's file `path`, or a one-line FluidError (see `read_text`)."""
    text = read_text(path, what)
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        where = f" (line {exc.lineno}, column {exc.colno}: {exc.msg})" if isinstance(exc, json.JSONDecodeError) else ""
        raise FluidError(f"{what} {path}: not valid JSON{where}") from None


# Upper bounds of the count options: far above any real use, low enough that a typo (an extra few zeros)
# is refused in one line rather than ending minutes later in a MemoryError.
MAX_SAMPLES = 10_000_000
MAX_SEEDS = 1000
MAX_BATCH = 64   # the NPU's Bmax limit (fluidnpu dse), also the serving commands' batch bound


class FloatRange(click.FloatRange):
    """click's FloatRange that also refuses NaN and infinity: NaN compares false with every bound,
    so click's own passes `--rate nan` through to code that cannot use it, and no option of these
    commands means anything by an infinite rate, time or share."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv
