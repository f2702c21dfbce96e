"""Every `fluidnpu …` invocation in README.md, run or parsed, so that the README stays true.

The examples are read from README.md itself: the Commands table and the code blocks are examples to
run, and a mention in the prose (`fluidnpu dse --design`) must name a command and options that exist.
An example's alternatives (`fluid|r|p|fc`) are taken at their first, its optional parts (`[--json]`)
are included, and its placeholders (`my.onnx`, `F.json`, `host:8001`) become real files the test
writes. What runs is the example itself, in-process through `fluidnpu.cli.main`, with the cheaper
equivalents in CHEAPER where a search of the full-size models would cost seconds each; the
commands in PARSE_ONLY are parsed by click against the command's own options and types (a
misspelt option, a bad choice or a missing required option fails), not run, for the reason given.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import click
import pytest

from fluidnpu.cli import cli, main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SMALL_BOARD = ROOT / "docs" / "examples" / "zc706_16dsp.json"

# Commands checked by parsing only, and why.
PARSE_ONLY = {
    "serve": "a server; tests/test_serve.py and tests/test_fleet_serve.py run it live",
    "edge": "a client of a server; tests/test_serve.py runs it live",
    "plan": "its --check replays and --run serves on Ray; tests/test_fleet_cli.py runs it",
    "flow": "the whole flow takes minutes; tests/test_flow.py runs it",
    "eval": "a figure takes minutes; tests/test_eval.py runs small ones",
    "rtl": "Amaranth elaboration, ~10 s; tests/test_rtl.py runs it",
    "vivado": "the RTL again, ~5 s; tests/test_hls_gen.py runs it",
    "gpu": "PyTorch; tests/test_gpu_cli.py runs it",
}

# Cheaper equivalents of the full-size searches: (option, README value, value run here). A search of
# ResNet-50 or Inception-v3 takes 9-20 s; digits-ee on the 16-DSP cut-down ZC706 at Bmax 2 takes 0.4 s
# and goes through the same command, options and output. A given --design is evaluated as written.
CHEAPER = [
    ("--model", "resnet50", "digits-ee"), ("-m", "resnet50", "digits-ee"),
    ("--board", "zc706", str(SMALL_BOARD)), ("--board", "zcu104", str(SMALL_BOARD)),
    ("-b", "zc706", str(SMALL_BOARD)),
    ("--bmax", "8", "2"), ("--fixed-batch", "8", "2"), ("--weights", "1,1,1,1,2,2,2,2", "1,2"),
    ("--banks", "4", "2"),
]
SEARCH_DEFAULTS = {"dse": {"--bmax": "2"}, "simulate": {"--bmax": "2", "--seeds": "1", "--samples": "300"}}


def _spans() -> list[tuple[str, str]]:
    """(kind, text) for each invocation in README.md: 'example' (table, code block) or 'mention'."""
    found: list[tuple[str, str]] = []
    for line in README.read_text().splitlines():
        code = re.match(r"\s{4}(?:\.venv/bin/)?(fluidnpu .*)", line)
        if code:
            found.append(("example", code.group(1)))
            continue
        cell = re.match(r"\| `(fluidnpu [^`]*)`", line)
        if cell:
            found.append(("example", cell.group(1)))
            line = line[cell.end():]
        found += [("mention", m) for m in re.findall(r"`(fluidnpu [^`]*)`", line)]
    return found


def _argv(text: str) -> list[str]:
    """The README's notation as argv: `\\|` alternatives at their first, `[...]` parts included."""
    text = text.replace("\\|", "|").replace("[", " ").replace("]", " ")
    return [tok.split("|")[0] for tok in text.split()][1:]


def _command(argv: list[str]) -> tuple[list[str], click.Command, list[str]]:
    """(command path, the click command, its own arguments) of a fluidnpu argv."""
    cmd: click.Command = cli
    path: list[str] = []
    ctx = click.Context(cli, info_name="fluidnpu")
    rest = list(argv)
    while isinstance(cmd, click.Group) and rest and not rest[0].startswith("-"):
        sub = cmd.get_command(ctx, rest[0])
        assert sub is not None, f"README names a command that does not exist: {' '.join(path + rest[:1])}"
        path.append(rest.pop(0))
        cmd = sub
    return path, cmd, rest


def _option(args: list[str], name: str) -> int | None:
    return args.index(name) if name in args else None


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """Real files for the README's placeholders."""
    d = tmp_path_factory.mktemp("readme")
    import runpy

    import onnx

    onnx_path = d / "ee_cnn.onnx"
    onnx.save(runpy.run_path(str(ROOT / "docs" / "examples" / "ee_cnn_onnx.py"))["build"](), str(onnx_path))
    bundle = d / "design.json"
    main(["dse", "--model", "digits-ee", "--board", str(SMALL_BOARD), "--bmax", "2", "-o", str(bundle), "--json"])
    shutil.copy(SMALL_BOARD, d / "my_board.json")
    for name in ("npu.bit", "token", "cert.pem", "key.pem"):
        (d / name).write_text("placeholder\n")
    fleet = ROOT / "docs" / "examples" / "fleet"
    return {"my.onnx": str(onnx_path), "ee_cnn.onnx": str(onnx_path), "design.json": str(bundle),
            "d.json": str(bundle), "my_board.json": str(d / "my_board.json"), "npu.bit": str(d / "npu.bit"),
            "F.json": str(fleet / "fleet.json"), "S.json": str(fleet / "sessions.json"),
            "F": str(d / "token"), "C": str(d / "cert.pem"), "K": str(d / "key.pem"), "host:8001": "127.0.0.1:8001",
            "N": "50", "H": "0.8", "J": "1", "Q": "0.99", "SECONDS": "2", "S": "1", "ADDR": "auto", "DIR": "eval",
            "RATE": "10"}


OUTPUTS = ("-o", "--output", "--out", "--plot")


def _substitute(argv: list[str], files: dict[str, str]) -> list[str]:
    """Placeholders as real files and values; what an example writes (-o design.json) stays in its folder."""
    return [tok if i and argv[i - 1] in OUTPUTS else files.get(tok, tok) for i, tok in enumerate(argv)]


def _id(text: str) -> str:
    return re.sub(r"[^\w.=,%/-]+", "_", text.replace("\\|", "|").split(" ", 1)[1])[:60]


EXAMPLES = [text for kind, text in _spans() if kind == "example"]
MENTIONS = sorted({text for kind, text in _spans() if kind == "mention"})


def test_the_readme_has_its_examples():
    """The extraction finds the Commands table and the code block (a README reshuffle fails here first)."""
    commands = {_command(_argv(t))[0][0] for t in EXAMPLES}
    assert {"dse", "models", "boards", "show", "flow", "rtl", "vivado", "simulate", "eval", "run", "serve", "edge",
            "gpu", "plan"} <= commands
    assert len(EXAMPLES) >= 25


@pytest.mark.parametrize("text", EXAMPLES, ids=_id)
def test_readme_example(text, files, tmp_path, monkeypatch, capsys):
    argv = _substitute(_argv(text), files)
    path, cmd, rest = _command(argv)
    if path[0] in PARSE_ONLY:
        rest = [t for t in rest if t != "..."]
        with cmd.make_context(" ".join(path), rest) as ctx:  # raises click.UsageError on anything wrong
            assert ctx.params is not None
        return
    if "..." in rest:  # "the same command as above": the first example's model and board where not given
        i = rest.index("...")
        rest[i:i + 1] = [x for opt, value in (("--model", "resnet50"), ("--board", "zc706")) if opt not in rest
                         for x in (opt, value)]
    if "--design" not in rest or path[0] == "simulate":
        for opt, value, cheap in CHEAPER:
            j = _option(rest, opt)
            if j is not None and rest[j + 1] == value:
                rest[j + 1] = cheap
        for opt, value in SEARCH_DEFAULTS.get(path[0], {}).items():
            if opt not in rest and not (path[0] == "simulate" and "--design" in rest and opt == "--bmax"):
                rest += [opt, value]
    if path[0] == "simulate" and "--design" not in rest:
        rest += ["--cache-dir", str(tmp_path / "cache")]
    monkeypatch.chdir(tmp_path)
    try:
        main([*path, *rest])
    except SystemExit as exc:
        assert exc.code in (0, None), (text, [*path, *rest], capsys.readouterr().err)
    if "--json" in rest:
        json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("text", MENTIONS, ids=_id)
def test_readme_mention_names_real_options(text):
    path, cmd, rest = _command(_argv(text))
    names = {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)}
    for tok in rest:
        if tok.startswith("-"):
            assert tok in names, f"README mentions `{text}`, but {' '.join(path)} has no {tok}"
