"""Bad inputs on every command end in one line on stderr and exit code 2, never a traceback.

Every command runs in this process through `fluidnpu.cli.main` (what the `fluidnpu` script calls), with:
an unwritable output path, a directory where a file belongs, an empty file, garbage JSON, a symlink
loop, a missing file and a hand-edited bundle. The loaders of the bundle and of a board file are fuzzed
with hypothesis: no mutation of a valid file raises anything but the one-line FluidError.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fluidnpu.boards.catalog import BOARD_DIR, load_board
from fluidnpu.bundle import bundle_from_result, load_bundle
from fluidnpu.cli import main
from fluidnpu.dse.search import DSEOptions, explore
from fluidnpu.errors import FluidError

REPO = Path(__file__).resolve().parents[1]


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def assert_one_line(capsys, *args: str, word: str = "") -> str:
    code, _, err = run_cli(capsys, *args)
    lines = err.strip().splitlines()
    assert code == 2, (args, err)
    assert "Traceback" not in err and len(lines) == 1, (args, err)
    assert word.lower() in lines[0].lower(), (args, lines[0], word)
    return lines[0]


@pytest.fixture(scope="module")
def good_bundle(tmp_path_factory) -> Path:
    """A small valid bundle on a ZC706-like 6-DSP board."""
    from fluidnpu.boards.catalog import board_from_data
    from fluidnpu.workload import Exit, Layer, Workload

    board = json.loads((BOARD_DIR / "zc706.json").read_text())
    board["name"] = "tiny"
    board["resources"]["dsp"]["value"] = 6
    board["resources"]["bram36"]["value"] = 8
    c1 = Layer.conv("c1", 3, 4, 5, 3, padding=1)
    wl = Workload("tiny", (c1, Layer.fc("fc", 4 * 25, 5)), (Exit("final", 1, (), 1.0),))
    bundle = bundle_from_result(explore(wl, board_from_data(board, "tiny"), DSEOptions(bmax=2)))
    path = tmp_path_factory.mktemp("bundle") / "design.json"
    bundle.save(path)
    return path


@pytest.fixture
def bad_files(tmp_path, good_bundle) -> dict[str, tuple[Path, str]]:
    """{kind: (path, a word the one-line error must contain)}."""
    (tmp_path / "adir").mkdir()
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "garbage.json").write_text('{"format": "fluidnpu-design", "design": {')
    (tmp_path / "loop_a.json").symlink_to(tmp_path / "loop_b.json")
    (tmp_path / "loop_b.json").symlink_to(tmp_path / "loop_a.json")
    data = json.loads(good_bundle.read_text())
    data["design"]["TP"] = max(1, data["design"]["TP"] - 1)  # a hand edit the design hash must catch
    (tmp_path / "edited.json").write_text(json.dumps(data))
    return {"directory": (tmp_path / "adir", "directory"), "empty": (tmp_path / "empty.json", "empty"),
            "garbage": (tmp_path / "garbage.json", "not valid JSON"),
            "symlink loop": (tmp_path / "loop_a.json", "symbolic link loop"),
            "missing": (tmp_path / "nope.json", "does not exist"),
            "hand-edited": (tmp_path / "edited.json", "design.TP was changed")}


BUNDLE_COMMANDS = {
    "show": lambda b, o: ["show", b],
    "rtl": lambda b, o: ["rtl", b, "-o", o],
    "vivado": lambda b, o: ["vivado", b, "-o", o],
    "run": lambda b, o: ["run", "--design", b, "--rate", "10", "--slo", "100"],
    "simulate": lambda b, o: ["simulate", "--design", b, "-p", "fluidb", "--rate", "10", "--slo", "100"],
}


@pytest.mark.parametrize("command", list(BUNDLE_COMMANDS))
def test_every_bundle_reader_refuses_bad_files_in_one_line(capsys, tmp_path, bad_files, command):
    for kind, (path, word) in bad_files.items():
        if command == "show" or kind != "garbage":
            line = assert_one_line(capsys, *BUNDLE_COMMANDS[command](str(path), str(tmp_path / "out")), word=word)
        else:  # the others name the same problem; one garbage check per command is enough
            line = assert_one_line(capsys, *BUNDLE_COMMANDS[command](str(path), str(tmp_path / "out")))
        assert str(path.name) in line, (command, kind, line)
        if kind == "hand-edited":
            assert "fluidnpu dse" in line and "--design" in line
    assert not (tmp_path / "out").exists()


def test_board_files_are_refused_in_one_line(capsys, bad_files):
    for kind, (path, word) in bad_files.items():
        if kind == "hand-edited":
            continue
        line = assert_one_line(capsys, "dse", "-m", "digits-ee", "-b", str(path), word=word)
        assert "board file" in line


def test_onnx_model_files_are_refused_in_one_line(capsys, tmp_path):
    pytest.importorskip("onnx")
    (tmp_path / "dir.onnx").mkdir()
    (tmp_path / "empty.onnx").write_bytes(b"")
    (tmp_path / "a.onnx").symlink_to(tmp_path / "b.onnx")
    (tmp_path / "b.onnx").symlink_to(tmp_path / "a.onnx")
    (tmp_path / "garbage.onnx").write_bytes(b"\x00\xff not protobuf" * 4)
    for name, word in (("dir.onnx", "directory"), ("empty.onnx", "empty"), ("a.onnx", "symbolic link"),
                       ("nope.onnx", "no such file"), ("garbage.onnx", "garbage.onnx")):
        assert_one_line(capsys, "dse", "-m", str(tmp_path / name), "-b", "zc706", word=word)


def test_every_writer_refuses_an_unwritable_path_in_one_line(capsys, tmp_path, good_bundle):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    under_file = blocker / "sub"              # its parent is a file: no folder can be made there
    proc_path = Path("/proc/fluidnpu-nope")   # not writable even for root
    b = str(good_bundle)
    for target in (under_file, proc_path):
        cases = [
            ["dse", "-m", "digits-ee", "-b", "zc706", "-o", str(target / "d.json")],
            ["dse", "-m", "digits-ee", "-b", "zc706", "--plot", str(target / "p.png")],
            ["rtl", b, "-o", str(target)],
            ["vivado", b, "-o", str(target)],
            ["eval", "fig7", "--out", str(target), "--no-plots"],
            ["flow", "--out", str(target)],
        ]
        for args in cases:
            line = assert_one_line(capsys, *args, word="cannot")
            assert str(target) in line, (args, line)
    # a directory where the bundle file should go; a file where the output folder should go
    assert_one_line(capsys, "dse", "-m", "digits-ee", "-b", "zc706", "-o", str(tmp_path), word="directory")
    assert_one_line(capsys, "rtl", b, "-o", str(blocker), word="is a file")


def test_an_os_error_outside_fluidnpu_output_still_ends_in_one_line(capsys, monkeypatch):
    """main()'s last net: a writer that bypasses fluidnpu.output (e.g. a plotting library) cannot traceback."""
    from fluidnpu import cli

    def deny(obj):
        raise PermissionError(13, "Permission denied", "/somewhere/figure.png")

    monkeypatch.setattr(cli, "emit_json", deny)
    line = assert_one_line(capsys, "models", "--json", word="cannot access /somewhere/figure.png")
    assert "permission denied" in line


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_is_one_line():
    from fluidnpu.output import write_text

    with pytest.raises(FluidError, match="cannot write design bundle /dev/full: no space left on the device"):
        write_text("/dev/full", "x" * 100000, "design bundle")


def test_unreadable_file_is_one_line(monkeypatch, tmp_path):
    """Permission bits do not stop root, so the OS error is injected where the file is read."""
    from fluidnpu import output

    path = tmp_path / "design.json"
    path.write_text("{}")

    def deny(self, *a, **kw):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(output.Path, "read_text", deny)
    with pytest.raises(FluidError, match=r"cannot read design bundle .*design.json: permission denied"):
        load_bundle(path)


def test_dse_design_writes_a_consistent_bundle_of_exactly_that_design(capsys, tmp_path):
    out = tmp_path / "d.json"
    code, stdout, err = run_cli(capsys, "dse", "-m", "digits-ee", "-b", "zc706", "--design", "30,4,4", "--bmax", "4",
                                "-o", str(out), "--json")
    assert code == 0, err
    bundle = load_bundle(out)
    assert bundle.design == (30, 4, 4) and bundle.bmax == 4
    assert json.loads(stdout)["searched"] is False
    # the same tables the search writes for that design
    from fluidnpu.dse.search import evaluate_design
    from fluidnpu.zoo import zoo_model

    ref = evaluate_design(zoo_model("digits-ee"), load_board("zc706"), 30, 4, 4, DSEOptions(bmax=4))
    assert bundle.data["latency"]["layer_cycles"] == ref.plan.cycles
    assert bundle.data["resources"] == ref.resources.to_dict()


def test_dse_design_of_the_searched_pick_gives_the_searched_bundle(capsys, tmp_path):
    """Asking for the design the search picks gives the same tables: only the search's own record differs."""
    board = str(REPO / "docs" / "examples" / "zc706_16dsp.json")
    common = ["dse", "-m", "digits-ee", "-b", board, "--bmax", "4"]
    assert run_cli(capsys, *common, "-o", str(tmp_path / "s.json"))[0] == 0
    searched = load_bundle(tmp_path / "s.json")
    design = ",".join(map(str, searched.design))
    assert run_cli(capsys, *common, "--design", design, "-o", str(tmp_path / "g.json"))[0] == 0
    given = load_bundle(tmp_path / "g.json")
    for key in ("board", "clock_mhz", "design", "bmax", "workload", "fbcb", "latency", "resources", "performance"):
        assert given.data[key] == searched.data[key], key
    assert given.data["dse"]["score_gops"] is None and given.data["dse"]["designs_evaluated"] == 1


def test_dse_design_that_does_not_fit_names_the_resource_and_the_excess(capsys):
    line = assert_one_line(capsys, "dse", "-m", "resnet50", "-b", "zc706", "--design", "4652,7,128",
                           word="does not fit zc706")
    assert "BRAM36" in line and "over" in line
    line = assert_one_line(capsys, "dse", "-m", "digits-ee", "-b", "zc706", "--design", "1,30,31", word="DSPs")
    assert "930 of 900" in line and "30 over" in line
    assert_one_line(capsys, "dse", "-m", "digits-ee", "-b", "zc706", "--design", "4,4", word="TR,TP,TC")


def test_a_bank_count_the_batching_cannot_use_is_refused_in_one_line(capsys):
    """A bank count the RTL cannot build for the batching is refused before any work. (NaN, infinity and
    out-of-range numbers on every option: tests/test_bad_input_matrix.py.)"""
    assert_one_line(capsys, "dse", "-m", "digits-ee", "-b", "zc706", "--batching", "r", "--banks", "4", word="banks")


# ---- the import graph ---------------------------------------------------------------------------

PACKAGE_DIRS = {"fluidnpu": "fluidnpu", "dse": "fluidnpu.dse", "hw": "fluidnpu.hw", "hls_gen": "fluidnpu.hls_gen",
                "boards": "fluidnpu.boards", "host_driver": "fluidnpu.host_driver",
                "scheduler_fw": "fluidnpu.scheduler_fw", "sim_tb": "fluidnpu.sim_tb"}


def _modules() -> dict[str, Path]:
    mods = {}
    for folder, package in PACKAGE_DIRS.items():
        for path in (REPO / folder).rglob("*.py"):
            rel = path.relative_to(REPO / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            mods[".".join([package, *parts])] = path
    return mods


def _imports(name: str, path: Path) -> set[str]:
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return found


def _is_cli(module: str) -> bool:
    return module == "fluidnpu.cli" or module.endswith(".cli")


def test_no_module_below_the_cli_imports_a_cli_module():
    mods = _modules()
    assert "fluidnpu.flow" in mods and "fluidnpu.hw.cli" in mods
    upward = []
    for name, path in mods.items():
        for imp in _imports(name, path):
            if imp in mods and _is_cli(imp) and imp != name:
                if not _is_cli(name) or imp == "fluidnpu.cli":  # a stage CLI must not reach up either
                    upward.append(f"{name} imports {imp}")
    assert not upward, upward


# ---- fuzzing the loaders ------------------------------------------------------------------------

JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=False),
                      st.text(max_size=6))
JSON_VALUE = st.recursive(JSON_LEAF, lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                            st.dictionaries(st.text(max_size=4), kids, max_size=3)),
                          max_leaves=6)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node[:4]):
            yield from _paths(v, prefix + (i,))


@st.composite
def mutated(draw, data):
    """`data` (a JSON tree) with a few values replaced, deleted, or its text cut or spliced."""
    data = json.loads(json.dumps(data))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(data) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(JSON_VALUE)
    text = json.dumps(data)
    if draw(st.integers(0, 5)) == 0:
        cut = draw(st.integers(0, len(text)))
        text = text[:cut] + draw(st.text(max_size=3)) + text[cut + draw(st.integers(0, 5)):]
    return text


def _check_loader(load, tmp_path, text: str) -> None:
    path = tmp_path / "fuzz.json"
    path.write_text(text)
    try:
        load(str(path))
    except FluidError as exc:
        assert "\n" not in str(exc)


@pytest.fixture(scope="module")
def bundle_data(good_bundle):
    return json.loads(good_bundle.read_text())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_bundles_never_raise_a_traceback(tmp_path, bundle_data, data):
    _check_loader(load_bundle, tmp_path, data.draw(mutated(bundle_data)))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_board_files_never_raise_a_traceback(tmp_path, data):
    board = json.loads((BOARD_DIR / "zc706.json").read_text())
    _check_loader(load_board, tmp_path, data.draw(mutated(board)))


def test_an_interrupted_writer_leaves_the_old_file_and_no_temporary(tmp_path):
    """`writing` writes beside the target and replaces it only at the end: Ctrl-C (or any error) part-way
    leaves the old file as it was and nothing else in the folder."""
    from fluidnpu.output import write_text, writing

    target = tmp_path / "plot.png"
    target.write_text("old")
    with pytest.raises(KeyboardInterrupt):
        with writing(target, "plot") as tmp:
            assert tmp.parent == tmp_path and tmp.suffix == ".png" and tmp != target  # savefig keeps the format
            tmp.write_text("half a fig")
            raise KeyboardInterrupt
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["plot.png"]
    write_text(target, "new")
    assert target.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["plot.png"]
    link = tmp_path / "link.png"
    link.symlink_to(target)
    write_text(link, "through the link")
    assert link.is_symlink() and target.read_text() == "through the link"
