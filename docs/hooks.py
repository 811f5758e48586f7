"""mkdocs hooks: what the site shows that the code holds (the CLI reference's commands, the verdict
rules, the cause bars) is generated from the code at build time, so the pages cannot drift from it."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def on_config(config, **kwargs):
    if str(HERE) not in sys.path:  # cli_reference.py, for mkdocs-click
        sys.path.insert(0, str(HERE))
    return config


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def verdict_rules() -> str:
    from commprobe.analyzers.cross_rank.verdict import RULES

    rows = ["| # | rule | verdict | holds when |", "|---|---|---|---|"]
    rows += [f"| {i} | {_cell(r.name)} | {_cell(str(r.verdict.value))} | {_cell(r.needs)} |"
             for i, r in enumerate(RULES, 1)]
    return "\n".join(rows)


def cause_bars() -> str:
    from commprobe.analyzers.cross_rank import cause
    from commprobe.analyzers.readers import telemetry

    bars = [("DOMINATES", "a part (transfer or waiting) dominates the exposed communication from this share"),
            ("MIN_MATCHED", "below this share of calls matched across ranks, the class is inconclusive"),
            ("SKEW_BAR", "skew is a cause from this share of end-to-end time waited, with a culprit"),
            ("SPREAD_BAR", "arrival jitter (no culprit) from this share, steady over the calls"),
            ("STEADY_CV", "the largest coefficient of variation of the waits still called steady"),
            ("SLOW_RATIO", "slow transfer: the fastest tenth of calls this many times the calibration's"),
            ("SLOW_BAR", "slow transfer also needs its excess to be this share of end-to-end time")]
    rows = ["| constant | value | meaning |", "|---|---|---|"]
    rows += [f"| `{n}` | {getattr(cause, n):.3g} | {m} |" for n, m in bars]
    host = [("CONTENDED_CORES", "a host is contended from this many cores of other work while the ranks ran ..."),
            ("SATURATED", "... with the host at least this share busy: then no slow transfer is named")]
    rows += [f"| `{n}` | {getattr(telemetry, n):.3g} | {m} |" for n, m in host]
    return "\n".join(rows)


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    if "<!-- verdict-rules -->" in markdown:
        markdown = markdown.replace("<!-- verdict-rules -->", verdict_rules())
    if "<!-- cause-bars -->" in markdown:
        markdown = markdown.replace("<!-- cause-bars -->", cause_bars())
    return markdown
