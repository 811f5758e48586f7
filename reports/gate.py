"""Render a gate result (commprobe.gate.GateResult.to_dict()) as Markdown, JUnit XML or a rich table.

Markdown is for a CI step summary (GitHub's $GITHUB_STEP_SUMMARY), JUnit for CI test
reports (one test case per metric: a regression is a failure, unusable input an error).
Nothing is computed here.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

_STATUS = {"pass": "pass", "regression": "REGRESSION", "improvement": "improved", "unusable": "UNUSABLE"}


def _num(x, unit: str) -> str:
    if x is None:
        return "–"
    if unit == "fraction":
        return f"{100 * x:.1f} %"
    return f"{x:.3g} {unit}"


def _change(m: dict) -> str:
    if m.get("change") is None:
        return "–"
    return f"{m['change']:+.1%}" if m["kind"] == "time" else f"{100 * m['change']:+.1f} pp"


def _ci(m: dict) -> str:
    ci = m.get("ci95")
    if not ci:
        return "–"
    if m["kind"] == "time":
        return f"[{ci[0] - 1:+.1%}, {ci[1] - 1:+.1%}]"
    return f"[{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}] pp"


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def headline(res: dict) -> str:
    n = len(res["metrics"])
    bad = sum(m["status"] == "regression" for m in res["metrics"])
    if res["status"] == "unusable":
        return f"commprobe gate: UNUSABLE input ({len(res['problems'])} problem(s)); failing closed"
    if res["status"] == "regression":
        return f"commprobe gate: REGRESSION in {bad} of {n} metrics"
    return f"commprobe gate: pass ({n} metrics)"


def to_markdown(res: dict) -> str:
    th = res["thresholds"]
    lines = [f"## {headline(res)}", "",
             f"Thresholds: times +{th['max_regression']:.0%}, shares +{100 * th['max_share_increase']:.1f} pp, "
             f"Mann-Whitney alpha {th['alpha']}, at least {th['min_samples']} samples.", ""]
    for p in res["problems"]:
        lines.append(f"- **unusable**: {_md_cell(p)}")
    for w in res["warnings"]:
        lines.append(f"- **warning**: {_md_cell(w)}")
    if res["problems"] or res["warnings"]:
        lines.append("")
    lines += ["| metric | baseline | current | change | 95 % CI | p | n (base/cur) | status |",
              "|---|---:|---:|---:|---:|---:|---:|---|"]
    for m in res["metrics"]:
        p = "–" if m.get("p_value") is None else f"{m['p_value']:.2g}"
        lines.append(f"| `{_md_cell(m['name'])}` | {_num(m.get('baseline_median'), m['unit'])} | "
                     f"{_num(m.get('current_median'), m['unit'])} | {_change(m)} | {_ci(m)} | {p} | "
                     f"{m['n_baseline']}/{m['n_current']} | {_STATUS[m['status']]} |")
    return "\n".join(lines) + "\n"


def to_junit(res: dict) -> str:
    metrics = res["metrics"]
    suite = ET.Element("testsuite", name="commprobe gate", tests=str(max(1, len(metrics))),
                       failures=str(sum(m["status"] == "regression" for m in metrics)),
                       errors=str(sum(m["status"] == "unusable" for m in metrics) + (1 if res["problems"] and not metrics else 0)))
    for m in metrics:
        case = ET.SubElement(suite, "testcase", classname="commprobe.gate", name=m["name"])
        if m["status"] == "regression":
            ET.SubElement(case, "failure", message=m["why"]).text = m["why"]
        elif m["status"] == "unusable":
            ET.SubElement(case, "error", message=m["why"]).text = m["why"]
        else:
            ET.SubElement(case, "system-out").text = m["why"]
    if res["problems"] and not metrics:
        case = ET.SubElement(suite, "testcase", classname="commprobe.gate", name="input")
        ET.SubElement(case, "error", message="; ".join(res["problems"])).text = "\n".join(res["problems"])
    for w in res["warnings"]:
        ET.SubElement(suite, "system-err").text = w
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def render_gate(res: dict, console) -> None:
    from rich.table import Table

    style = {"pass": "green", "regression": "bold red", "unusable": "bold red"}[res["status"]]
    console.print(f"[{style}]{headline(res)}[/]", highlight=False)
    for p in res["problems"]:
        console.print(f"  unusable: {p}", markup=False, highlight=False)
    for w in res["warnings"]:
        console.print(f"  warning: {w}", markup=False, highlight=False)
    if not res["metrics"]:
        return
    table = Table()
    for col in ("metric", "baseline", "current", "change", "95% CI", "p", "n", "status"):
        table.add_column(col, justify="left" if col in ("metric", "status") else "right")
    for m in res["metrics"]:
        p = "–" if m.get("p_value") is None else f"{m['p_value']:.2g}"
        table.add_row(m["name"], _num(m.get("baseline_median"), m["unit"]), _num(m.get("current_median"), m["unit"]),
                      _change(m), _ci(m), p, f"{m['n_baseline']}/{m['n_current']}", _STATUS[m["status"]])
    console.print(table)
