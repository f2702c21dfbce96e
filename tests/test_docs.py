"""The documentation describes the present and cannot drift from the figures' JSON.

docs/*.md and README.md carry no build history (no "wave", no dated headings: history is CHANGELOG.md's),
stay within a line budget, link only to files (and headings) that exist, and every table that quotes a
JSON of docs/figures/ is rebuilt here from that JSON and must appear in its page as written. A page that
includes a generated Markdown file (`<!-- include:PATH -->` … `<!-- /include:PATH -->`) must hold that
file's text. Run as a script, this module prints the tables, to paste after a re-run of a benchmark.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FIGURES = DOCS / "figures"
PAGES = sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]

# The docs' total line count; lower it when a page shrinks, never raise it to let history back in.
LINE_BUDGET = 4000

MONTHS = ("January|February|March|April|May|June|July|August|September|October|November|December|"
          "Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec")
DATED = re.compile(rf"\b(20\d\d-\d\d-\d\d|(?:{MONTHS})\.? +(?:\d{{1,2}}, +)?20\d\d)\b")


def _json(rel: str) -> Any:
    return json.loads((FIGURES / rel).read_text())


def _n(v: float) -> str:
    return f"{v:,.0f}"


def _pct(v: float, plus: bool = True) -> str:
    s = f"{100 * v:+.1f} %" if plus else f"{100 * v:.1f} %"
    return s.replace("-", "−")


# ---------------------------------------------------------------- tables rebuilt from docs/figures


def rtl_agreement_table() -> str:
    """docs/rtl-agreement.md's per-configuration summary, from figures/rtl/agreement.json."""
    doc = _json("rtl/agreement.json")
    configs: dict[str, list[dict[str, Any]]] = {}
    for r in doc["rows"]:
        configs.setdefault(r["config"], []).append(r)
    lines = ["| configuration | cases | within 5 % | mean \\|error\\| | worst | bit-exact |",
             "|---|---|---|---|---|---|"]
    for name, rows in configs.items():
        errs = [r["error"] for r in rows]
        worst = max(errs, key=abs)
        lines.append(f"| {name} | {len(rows)} | {sum(abs(e) <= 0.05 for e in errs)} | "
                     f"{_pct(sum(map(abs, errs)) / len(errs), False)} | {_pct(worst)} | "
                     f"{'yes' if all(r['correct'] for r in rows) else 'NO'} |")
    s = doc["summary"]
    lines.append(f"| **all** | {s['cases']} | **{s['within_5pct']}** | **{_pct(s['mean_abs_error'], False)}** | "
                 f"{_pct(s['worst_error'])} | {'yes' if s['all_correct'] else 'NO'} |")
    return "\n".join(lines)


def compute_bound_table() -> str:
    """The compute-bound layer on each bus, from figures/rtl/agreement.json."""
    lines = ["| bus | CYC_BUSY | CYC_MAC | CYC_MAC / CYC_BUSY | model cycles | model share | error |",
             "|---|---|---|---|---|---|---|"]
    for r in _json("rtl/agreement.json")["compute_bound"]:
        bus = f"{r['axi_ports']} × {r['axi_dw']}-bit"
        lines.append(f"| {bus} | {_n(r['hw_cycles'])} | {_n(r['mac_cycles'])} | {_pct(r['mac_share'], False)} | "
                     f"{_n(r['model_cycles'])} | {_pct(r['model_mac_share'], False)} | {_pct(r['error'])} |")
    return "\n".join(lines)


def pick_layers_table() -> str:
    """ResNet-50 layer shapes on the ZC706 pick's ⟨TP, TC⟩ and ports, from figures/rtl/agreement.json."""
    lines = ["| layer | RTL cycles | model cycles | error | MAC-active |", "|---|---|---|---|---|"]
    for r in _json("rtl/agreement.json")["pick_layers"]:
        lines.append(f"| {r['layer']} | {_n(r['hw_cycles'])} | {_n(r['model_cycles'])} | {_pct(r['error'])} | "
                     f"{_pct(r['mac_share'], False)} |")
    return "\n".join(lines)


def buffered_table() -> str:
    """Each buffered layer from DDR and from the block input buffer, from figures/rtl/buffered.json."""
    doc = _json("rtl/buffered.json")
    lines = ["| # | engine ⟨TR, TP, TC⟩, ports, buffer words | b, BR | DDR: RTL cycles (vs model) | "
             "buffered: RTL cycles (vs model) | buffered vs DDR | MAC-active | DDR read beats |",
             "|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        e = doc["engines"][r["engine"]]
        d, f = r["ddr"], r["buffered"]
        lines.append(
            f"| {r['case']} | ⟨{e['TR']}, {e['TP']}, {e['TC']}⟩, {e['axi_ports']} × {e['axi_dw']}, "
            f"{_n(e['input_buffer'])} | {d['b']}, {d['BR']} | "
            f"{_n(d['hw_cycles'])} ({_pct(d['hw_cycles'] / d['model_cycles'] - 1)}) | "
            f"{_n(f['hw_cycles'])} ({_pct(f['hw_cycles'] / f['model_cycles'] - 1)}) | "
            f"{_pct(f['hw_cycles'] / d['hw_cycles'] - 1)} | {_pct(d['mac_cycles'] / d['hw_cycles'], False)} → "
            f"{_pct(f['mac_cycles'] / f['hw_cycles'], False)} | {_n(d['read_beats'])} → {_n(f['read_beats'])} |")
    return "\n".join(lines)


def fleet_scenarios_table() -> str:
    """docs/fleet.md's scenarios, from figures/fleet/scenarios.json (benchmarks/fleet_scenarios.py)."""
    lines = ["| scenario | arrivals | answered | retried | refused | within SLO (per session) | device-seconds |",
             "|---|---|---|---|---|---|---|"]
    for r in _json("fleet/scenarios.json"):
        per = ", ".join(f"{x['model']} {_pct(x['within_slo'] / x['arrivals'], False)}" for x in r["sessions"])
        lines.append(f"| {r['scenario']} | {_n(r['arrivals'])} | {_n(r['answered'])} | {r['retried']} | "
                     f"{r['rejected']} | **{100 * r['slo_compliance']:.2f} %** ({per}) | {r['device_seconds']:.0f} |")
    return "\n".join(lines)


def fleet_headroom_table() -> str:
    """docs/fleet.md's replay against headroom, from figures/fleet/headroom.json (benchmarks/plan_headroom.py)."""
    rows = _json("fleet/headroom.json")["rows"]
    sessions = [k for k in rows[0] if k[:1] == "s" and k[1:2].isdigit()]
    lines = ["| ℓ(b) | h | nodes | all requests | " + " | ".join(sessions) + " |", "|---" * (len(sessions) + 4) + "|"]
    for r in rows:
        lines.append(f"| {r['pricing']} | {r['headroom']:g} | {r['nodes']} | {100 * r['compliance']:.2f} % | "
                     + " | ".join(f"{100 * r[k]:.1f} %" for k in sessions) + " |")
    return "\n".join(lines)


TABLES = {  # page -> the tables it must hold
    "rtl-agreement.md": (rtl_agreement_table, compute_bound_table, pick_layers_table, buffered_table),
    "fleet.md": (fleet_scenarios_table, fleet_headroom_table),
}


# ---------------------------------------------------------------- the checks


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_history_in_the_docs(page: Path) -> None:
    text = page.read_text()
    waves = [ln for ln in text.splitlines() if re.search(r"\bwaves?\b", ln, re.I)]
    assert not waves, f"{page.name} narrates build waves (history goes to CHANGELOG.md): {waves[:3]}"
    dated = [ln for ln in text.splitlines() if ln.startswith("#") and DATED.search(ln)]
    assert not dated, f"{page.name} has dated headings: {dated[:3]}"


def test_the_docs_stay_within_their_line_budget() -> None:
    total = sum(len(p.read_text().splitlines()) for p in DOCS.glob("*.md"))
    assert total <= LINE_BUDGET, f"docs/*.md is {total} lines, over the budget of {LINE_BUDGET}"


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for ln in page.read_text().splitlines():
        m = re.match(r"#{1,6} +(.*)", ln)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(target)
    assert not broken, f"{page.name} links to what does not exist: {broken}"


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_included_files_are_as_generated(page: Path) -> None:
    text = page.read_text()
    for rel, body in re.findall(r"<!-- include:(\S+) -->\n(.*?)<!-- /include:\1 -->", text, re.S):
        assert body == (DOCS / rel).read_text(), f"{page.name}'s copy of {rel} is stale: paste the file again"


@pytest.mark.parametrize("page,table", [(p, t) for p, ts in TABLES.items() for t in ts],
                         ids=lambda v: v if isinstance(v, str) else v.__name__)
def test_tables_match_their_json(page: str, table: Any) -> None:
    assert table() in (DOCS / page).read_text(), (
        f"docs/{page} does not hold {table.__name__}'s table as the JSON gives it: "
        f"run `python tests/test_docs.py` and paste it")


def test_results_md_holds_what_its_json_generates(tmp_path: Path) -> None:
    """docs/results.md's generated blocks are what `fluidnpu eval` writes from docs/figures/eval today."""
    from fluidnpu.scheduler_fw.results_doc import update_results_md

    page = tmp_path / "results.md"
    page.write_text((DOCS / "results.md").read_text())
    assert len(update_results_md(page, FIGURES / "eval")) == 8
    assert page.read_text() == (DOCS / "results.md").read_text(), "docs/results.md is stale: run update_results_md"


if __name__ == "__main__":
    for page, tables in TABLES.items():
        if len(sys.argv) < 2 or page in sys.argv[1:]:
            for t in tables:
                print(f"<!-- {page}: {t.__name__} -->\n{t()}\n")
