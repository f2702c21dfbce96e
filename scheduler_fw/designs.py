"""Each policy's NPU design: the DSE it is evaluated on, run once and cached.

The DSE takes seconds per design, and an evaluation needs the same handful of
designs again and again (every rate, seed and SLO of a figure), so results
are kept as design bundles under a cache directory. The cache key covers
everything that changes a design: the workload, the board, the DSE options,
and the source of the performance and resource models, so editing the model
invalidates stale entries by itself.

Host-side code.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from fluidnpu import __version__
from fluidnpu.bundle import Bundle, bundle_from_result, load_bundle
from fluidnpu.errors import FluidError
from fluidnpu.scheduler_fw.registry import DesignKind

CACHE_ENV = "FLUIDNPU_CACHE_DIR"


def default_cache_dir() -> Path:
    """$FLUIDNPU_CACHE_DIR, else ~/.cache/fluidnpu."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "fluidnpu"


def dse_options(kind: DesignKind, bmax: int):
    """The DSEOptions of a design kind at Bmax."""
    from fluidnpu.dse.search import DSEOptions

    fixed = {"all": None, "bmax": bmax, "one": 1}[kind.batch]
    return DSEOptions(bmax=bmax, batching=kind.batching, stackable=kind.stackable, fixed_batch=fixed)


def _model_fingerprint() -> str:
    import fluidnpu.bundle
    import fluidnpu.dse

    h = hashlib.sha256(__version__.encode())
    for f in sorted(Path(fluidnpu.dse.__file__).parent.glob("*.py")) + [Path(fluidnpu.bundle.__file__)]:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def cache_key(workload, board, options) -> str:
    from dataclasses import asdict

    blob = json.dumps({"workload": workload.to_dict(), "board": board.to_dict(), "options": asdict(options),
                       "model": _model_fingerprint()}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def design_for(workload, board, kind: DesignKind, bmax: int, cache_dir: Path | None = None,
               progress: Callable[[int, int], None] | None = None) -> tuple[Bundle, bool]:
    """(bundle, came_from_cache) for `kind` on workload/board; runs fluidnpu.dse.search.explore on a miss."""
    from fluidnpu.dse.search import explore

    opts = dse_options(kind, bmax)
    opts.validate(board)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    safe = "".join(c if c.isalnum() else "-" for c in f"{workload.name}-{board.name}-{kind.key}-b{bmax}")
    path = cache / "dse" / f"{safe}-{cache_key(workload, board, opts)}.json"
    if path.is_file():
        try:
            return load_bundle(path), True
        except FluidError:
            pass  # corrupt entry: recompute and overwrite
    bundle = bundle_from_result(explore(workload, board, opts, progress=progress))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as fh:
            fh.write(json.dumps(bundle.data, indent=1) + "\n")
        os.replace(fh.name, path)
    except OSError as exc:
        raise FluidError(f"cannot write the DSE cache under {cache}: {exc.strerror or exc}") from None
    return bundle, False
