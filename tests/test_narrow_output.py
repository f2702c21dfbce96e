"""What the commands print, read at 80 columns: no line wider, no value cut with "…", every figure whole.

Each command runs in-process with the `out`/`err` consoles at 80 columns (what a piped run or an
80-column terminal gets), and the figures its `--json` gives are looked for, whole, among the words of
its tables. fluidnpu/tables.py's splitting is tested on its own first.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table

from fluidnpu import output
from fluidnpu.cli import main
from fluidnpu.tables import fit, print_table

ROOT = Path(__file__).resolve().parent.parent
SMALL_BOARD = ROOT / "docs" / "examples" / "zc706_16dsp.json"
WIDTH = 80


def words(text: str) -> set[str]:
    """The cells' words: the text split at spaces and at the tables' rules."""
    return set(re.split(r"[\s│┃|]+", text))


def assert_fits(text: str) -> None:
    wide = [line for line in text.splitlines() if len(line) > WIDTH]
    assert not wide, f"{len(wide)} lines over {WIDTH} columns, e.g. {wide[0]!r}"
    assert "…" not in text, "a value cut with …"


@pytest.fixture
def narrow(monkeypatch, capsys):
    """Run fluidnpu in-process at 80 columns; returns a function giving (stdout, stderr) of one command."""
    for console in (output.out, output.err):
        monkeypatch.setattr(console, "_width", WIDTH)

    def run(*argv: str) -> str:
        capsys.readouterr()
        main(list(argv))
        text = capsys.readouterr().out
        if "--json" not in argv:
            assert_fits(text)
        return text

    return run


# ---- the splitter --------------------------------------------------------------------------------

def _wide_table() -> Table:
    t = Table(title="segment latency")
    t.add_column("segment")
    for b in range(1, 13):
        t.add_column(f"b={b}", justify="right")
    for name in ("exit1", "final"):
        t.add_row(name, *(f"{1000 + 7.25 * b:.2f}" for b in range(1, 13)))
    return t


def test_a_too_wide_table_is_split_into_column_groups_that_repeat_the_key():
    console = Console(width=WIDTH, record=True, file=open(os.devnull, "w"))
    parts = fit(console, _wide_table())
    assert len(parts) == 2  # 12 columns of 7-character values do not fit 80 columns beside the key; 6 do
    assert [len(p.columns) for p in parts] == [7, 7]
    assert all(p.columns[0].header == "segment" for p in parts)
    print_table(console, _wide_table())
    text = console.export_text()
    assert_fits(text)
    assert {f"{1000 + 7.25 * b:.2f}" for b in range(1, 13)} <= words(text)
    assert "segment latency (1/2)" in text and "segment latency (2/2)" in text


def test_a_table_that_wraps_at_spaces_stays_one_table():
    t = Table(title="sources")
    t.add_column("figure")
    t.add_column("value [source]")
    t.add_row("resources.dsp", "900 [DS190 Zynq-7000 SoC Overview, Table 3 (Z-7045: 900 DSP48E1 slices)] " * 2)
    console = Console(width=WIDTH, record=True, file=open(os.devnull, "w"))
    assert len(fit(console, t)) == 1
    console.print(t)
    assert_fits(console.export_text())


def test_piped_output_is_the_terminals_width_or_80():
    code = "from fluidnpu.output import out, err; print(out.width, err.width)"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    for columns, want in ((None, "80 80"), ("100", "100 100")):
        e = env if columns is None else env | {"COLUMNS": columns}
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e,
                              stdin=subprocess.DEVNULL)
        assert proc.stdout.split() == want.split(), proc.stderr


# ---- the commands ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def r50(tmp_path_factory) -> Path:
    """ResNet-50 on ZC706 at the DSE's pick, evaluated without the search (2 s): 63 layers, Bmax 8."""
    path = tmp_path_factory.mktemp("narrow") / "r50.json"
    main(["dse", "--model", "resnet50", "--board", "zc706", "--design", "386,14,64", "-o", str(path), "--json"])
    return path


def test_show_with_layers_at_80_columns(narrow, r50):
    text = narrow("show", str(r50), "--layers")
    doc = json.loads(narrow("show", str(r50), "--layers", "--json"))
    w = words(text)
    res = doc["resources"]
    assert {str(res["dsp"]), str(res["lut"]), str(res["ff"]), f"{res['bram36']:g}"} <= w
    assert {f"{g:.1f}" for g in doc["gops"]} <= w
    assert {f"{s:.2f}" for row in doc["segment_latency_ms"] for s in row} <= w
    for layer in doc["layers"]:
        assert {layer["name"], f"{layer['R']}x{layer['P']}x{layer['C']}"} <= w, layer["name"]
        k = {1.0: "1", 2.0: "2", 0.5: "½"}
        assert {f"{e['BR']},{k[e['k']]}{'·B' if e['buffered'] else ''}" for e in layer["fbcb"]} <= w, layer["name"]
    assert "(1/2)" in text  # the exit-segment and FBCB tables are each split in two at 80 columns


def test_dse_at_80_columns(narrow, r50):
    text = narrow("dse", "--model", "resnet50", "--board", "zc706", "--design", "386,14,64")
    doc = json.loads(narrow("show", str(r50), "--json"))
    assert {f"{s:.2f}" for row in doc["segment_latency_ms"] for s in row} <= words(text)
    assert {f"{g:.1f}" for g in doc["gops"]} <= words(text)
    assert "<TR, TP, TC> = <386, 14, 64>" in " ".join(text.split())


def test_models_and_boards_at_80_columns(narrow):
    text = narrow("models")
    for m in json.loads(narrow("models", "--json")):
        assert {m["name"], f"{m['gmac']:.3f}", "x".join(map(str, m["input_shape"]))} <= words(text)
        assert all(f"{100 * e['rate']:.1f}%" in text for e in m["exits"])
    text = narrow("boards")
    for b in json.loads(narrow("boards", "--json")):
        assert {b["name"], b["part"], str(b["dsp"]), f"{b['bandwidth_gb_s']:.2f}"} <= words(text)
    for name in ("zc706", "zcu104"):
        text = narrow("boards", name)
        doc = json.loads(narrow("boards", name, "--json"))
        assert set(doc["sources"]) <= words(text)
        assert str(doc["dsp"]) in words(text) and f"{doc['bandwidth_gb_s']:.2f}" in words(text)


def test_simulate_at_80_columns(narrow, r50):
    args = ("simulate", "--design", str(r50), "-p", "fluidb", "--rate", "15", "--slo", "400", "--seeds", "1",
            "--samples", "300")
    text = narrow(*args)
    m = json.loads(narrow(*args, "--json"))["metrics"]
    assert {f"{m['mean_latency_ms']:.1f}", f"{m['p99_latency_ms']:.1f}", f"{m['throughput']:.2f}"} <= words(text)


def test_run_report_at_80_columns(narrow, tmp_path):
    bundle = tmp_path / "digits.json"
    main(["dse", "--model", "digits-ee", "--board", str(SMALL_BOARD), "--bmax", "2", "-o", str(bundle), "--json"])
    text = narrow("run", "--device", "model", "--model", "digits-ee", "--rate", "200", "--slo", "50", "--samples",
                  "40", "--design", str(bundle))
    assert "wall-clock serving" in text and "accuracy" in text


@pytest.mark.parametrize("name", ["fig4", "fig5", "fig6", "fig7", "table1"])
def test_eval_summaries_at_80_columns(name, monkeypatch):
    """`fluidnpu eval`'s tables of the committed reproductions (docs/figures/eval), printed as eval prints them."""
    from fluidnpu.scheduler_fw.cli import _print_summary

    result = json.loads((ROOT / "docs" / "figures" / "eval" / f"{name}.json").read_text())
    console = Console(width=WIDTH, record=True, file=open(os.devnull, "w"))
    _print_summary(console, name, result)
    text = console.export_text()
    assert_fits(text)
    w = words(text)
    if name == "table1":
        for row in result["summary"]["rows"]:
            for source in ("ours", "paper"):
                v = row[source]
                assert {f"{v['fluidb'][0]:.0f}", f"{100 * v['fluidb'][1]:.1f}%",
                        f"{row[f'{source}_latency_ratio']:.2f}x", f"{row[f'{source}_violation_pp']:.1f}"} <= w
        assert {"ours", "paper"} <= w and "[" not in text  # the paper's figures labelled, not bracketed
    elif name == "fig7":
        for v in result["summary"].values():
            for g in v["gops"].values():
                assert {f"{x:.1f}" for x in g.values()} <= w
    else:
        metric = "slo_violation_rate" if name == "fig6" else "mean_latency_ms"
        scale = 100 if name == "fig6" else 1
        assert {f"{scale * r[metric]:.1f}" for r in result["rows"]} <= w  # own designs and FluidB's, both
        if name != "fig6":
            assert "each on its own design" in text and "all on FluidB's design" in text
