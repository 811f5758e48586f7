"""Sections of the HTML report beyond one analysis: the comparison of backends or runs, the engine's
phases, and a hang's findings. Each renders numbers the analyzers (analysis.compare,
analyzers/hang.py) computed; nothing here computes a share or a ratio of its own. Every string
from a trace, a manifest or a dump is escaped where it lands."""

from __future__ import annotations

import html

import plotly.graph_objects as go

from commprobe.common.vocab import WORK_CATEGORIES, Verdict

from .words import latency_words

COLORS = {"compute": "#4c78a8", "tp_allreduce": "#e45756", "cp_ring": "#f58518", "ep_all_to_all": "#b279a2",
          "other_comm": "#ff9da6", "memcpy": "#9d755d", "other": "#bab0ac", "straggler wait": "#eeca3b",
          "idle": "#d9d9d9"}


def esc(x) -> str:
    return html.escape(str(x), quote=True)


def verdict_class(label: str) -> str:
    """The CSS class of a verdict label (one the analyzer wrote; anything else gets none)."""
    return Verdict(label).css if label in set(Verdict) else ""


def add_segment_bars(fig: go.Figure, rows: list[tuple[str, dict]]) -> None:
    """One horizontal bar per category interval of each row's window segment (`rows`: y label,
    the rank's `segments[phase]`), coloured by category: the per-rank timelines of the page."""
    for c in WORK_CATEGORIES:
        ys, xs, bases = [], [], []
        for label, seg in rows:
            for a, b in seg["by_category"].get(c, []):
                ys.append(label)
                xs.append(b - a)
                bases.append(a)
        if xs:
            fig.add_bar(name=c, y=ys, x=xs, base=bases, orientation="h", marker_color=COLORS[c])


def _pct(x) -> str:
    return "–" if x is None else f"{x:.0%}"


def _us(x) -> str:
    return "–" if x is None else f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _ratio(x) -> str:
    return "–" if x is None else f"{x:.2f}×"


def _split(p: dict) -> str:
    """' (transfer x, waiting y)' where the analysis told them apart."""
    c = p.get("communication_cause")
    if not c or c["class"] == "inconclusive":
        return ""
    carried = c.get("wait_carried_share")
    more = f", {_pct(carried)} of it carried over by the transport" if carried and carried >= 0.05 else ""
    return f" (transfer {_pct(c['transfer_share'])}, waiting {_pct(c['wait_share'])}{more})"


def comparison_section(by_label: dict[str, dict], comparisons: dict[str, dict]) -> str:
    """Verdict per backend (or run) and phase side by side, then per phase the breakdown of B against
    A per category (`comparisons`: label -> analysis.compare(first, that), B/A as compare wrote it)."""
    labels = list(by_label)
    phases = list(dict.fromkeys(ph for res in by_label.values() for ph in res["phases"]))
    head = "".join(f"<th>{esc(lb)}</th>" for lb in labels)
    rows = []
    for ph in phases:
        cells = []
        for lb in labels:
            p = by_label[lb]["phases"].get(ph)
            cells.append("<td>–</td>" if p is None else
                         f'<td class="{verdict_class(p["verdict"])}"><b>{esc(p["verdict"])}</b><br>exposed communication '
                         f'{_pct(p["exposed_comm_share"])}{_split(p)}; {esc(p["dominant"])} {_pct(p["dominant_share"])}<br>'
                         f'{_us(p["e2e_us_per_window"])} µs per window</td>')
        rows.append(f"<tr><th>{esc(ph)}</th>{''.join(cells)}</tr>")
    out = [f'<h2>Comparison: {esc(" vs ".join(labels))}</h2>',
           f'<table id="comparison-verdicts"><tr><th>phase</th>{head}</tr>{"".join(rows)}</table>']
    first = labels[0]
    for lb, cmp in comparisons.items():
        body = []
        for ph, p in cmp["phases"].items():
            body.append(f'<tr class="phase"><th>{esc(ph)}</th><td>{_us(p["a_e2e_us"])}</td><td>{_us(p["b_e2e_us"])}</td>'
                        f'<td><b>{_ratio(p["ratio"])}</b></td><td>{esc(p["a_verdict"])} → {esc(p["b_verdict"])}</td></tr>')
            for c in WORK_CATEGORIES:
                v = p["categories"][c]
                if v["a_us"] or v["b_us"]:
                    body.append(f"<tr><td>&nbsp;&nbsp;{esc(c)}</td><td>{_us(v['a_us'])}</td><td>{_us(v['b_us'])}</td>"
                                f"<td>{_ratio(v['ratio'])}</td><td></td></tr>")
        lat = cmp.get("latency") or {}
        said = [latency_words(lat, m, lb, first) for m in ("ttit", "ttft") if m in lat] or (
            [latency_words(lat, "ttit", lb, first)] if lat.get("note") else [])
        out.append(f'<h3>{esc(lb)} against {esc(first)} (exposed µs per window; B/A &lt; 1: {esc(lb)} faster)</h3>'
                   f'<ul class="latency" id="latency-{esc(lb)}">' + "".join(f"<li>{esc(x)}</li>" for x in said) + "</ul>"
                   f'<table class="ba" id="ba-{esc(lb)}"><tr><th>phase / category</th><th>{esc(first)}</th>'
                   f'<th>{esc(lb)}</th><th>B/A</th><th>verdict</th></tr>{"".join(body)}</table>')
    return "".join(out)


def timelines_figure(by_label: dict[str, dict], phase: str) -> go.Figure | None:
    """One window of `phase` per rank and backend (or run), on one time scale (µs from each window's
    start): what ran when, side by side."""
    rows = [(lb, r["rank"], r["segments"][phase]) for lb, res in by_label.items() for r in res["ranks"]
            if phase in r.get("segments", {})]
    if len({lb for lb, _, _ in rows}) < 2:
        return None
    fig = go.Figure()
    add_segment_bars(fig, [(f"{lb} · rank {rank}", seg) for lb, rank, seg in rows])
    fig.update_layout(barmode="overlay", height=max(300, 140 + 36 * len(rows)), legend_title="category",
                      title=f"One {phase} window per rank and {'backend' if len(by_label) else 'run'}, one time scale "
                            f"(µs from the window's start)", xaxis={"title": "µs", "tickformat": "~s"})
    fig.update_yaxes(categoryorder="category descending")
    return fig


def engine_phases_section(result: dict) -> str:
    """The windows per phase with the engine's own step counts and the rule that chose them."""
    ranks = result.get("ranks") or []
    rule = (ranks[0].get("phase_rule") or {}) if ranks else {}
    steps = rule.get("engine_steps") or {}
    if not steps:
        return ""
    keys = sorted({k for st in steps.values() for k in st if k != "steps"})
    head = "".join(f"<th>{esc(k.replace('_', ' '))}</th>" for k in keys)
    body = "".join(
        f"<tr><th>{esc(ph)}</th><td>{result['phases'].get(ph, {}).get('windows', '–')}</td><td>{st.get('steps', 0)}</td>"
        + "".join(f"<td>{st.get(k, 0)}</td>" for k in keys) + "</tr>" for ph, st in steps.items())
    malformed = rule.get("malformed", 0)
    return (f'<h2>Engine phases</h2><p>Windows chosen by the rule <code>{esc(rule.get("rule"))}</code> '
            f'({esc(rule.get("source"))}); rank {ranks[0]["rank"]}\'s engine steps'
            + (f"; {malformed} step annotation(s) that did not parse: "
               + ", ".join(f"<code>{esc(n)}</code>" for n in rule.get("malformed_names", [])) if malformed else "")
            + f'.</p><table id="engine-phases"><tr><th>phase</th><th>windows</th><th>steps</th>{head}</tr>{body}</table>')


def hang_section(hang: dict | None) -> str:
    """A hang's findings (commprobe.hang/2), first on the page: the run did not finish."""
    if not hang:
        return ""
    rows = []
    for f in [x for root in hang["findings"] for x in (root, *root.get("consequences", ()))]:
        stacks = "<br>".join(f"rank {esc(r)}: <code>{esc(s['file'])}:{s['line']}</code> ({esc(s['name'])})" if s
                             else f"rank {esc(r)}: ?" for r, s in f["stacks"].items())
        role = "root cause" if f.get("role", "root") == "root" else "consequence"
        rows.append(f"<tr class=\"{role.replace(' ', '-')}\"><td><b>{esc(f['kind'])}</b> ({role})</td><td>{esc(f['axis'] or '')} group {esc(f['ranks'])}</td>"
                    f"<td>{esc(f['op'] or '')}</td><td>{esc(f['seq'] if f['seq'] is not None else '')}</td>"
                    f"<td>{esc(f['summary'])}</td><td>{stacks}</td></tr>")
    notes = "".join(f"<li>{esc(n)}</li>" for n in hang.get("notes", []))
    return ('<h2 class="communication">The run hung: Flight Recorder findings</h2>'
            '<table id="hang-findings"><tr><th>finding</th><th>group</th><th>op</th><th>seq</th><th>what</th>'
            f'<th>where each rank waits</th></tr>{"".join(rows)}</table>' + (f"<ul>{notes}</ul>" if notes else ""))


def cause_rows(result: dict) -> list[dict]:
    """Per phase with communication: the split the analysis made (cross_rank/cause.py), as display
    rows. Nothing computed here but formatting."""
    rows = []
    for ph, p in result["phases"].items():
        c = p.get("communication_cause")
        if not c:
            continue
        base = c.get("baseline") or {}
        rows.append({"phase": ph, "class": c["class"], "transfer": c["transfer_share"], "waiting": c["wait_share"],
                     "culprit": "–" if c.get("culprit") is None else f"rank {c['culprit']}",
                     "vs_baseline": c.get("transfer_vs_baseline"), "baseline": base.get("source", "–"),
                     "cause": ", ".join(f"{x['cause']}" + (f" (rank {x['rank']})" if x.get("rank") is not None else "")
                                        for x in c["causes"]) or "none",
                     "matched": c["matched_share"]})
    return rows


def cause_section(result: dict) -> str:
    """Transfer vs waiting for a late rank, per phase: the split behind the verdict."""
    rows = cause_rows(result)
    if not rows:
        return ""
    def times(x) -> str:
        return "–" if x is None else f"{x:.2f}×"

    body = "".join(
        f"<tr><th>{esc(r['phase'])}</th><td>{esc(r['class'])}</td><td>{_pct(r['transfer'])}</td><td>{_pct(r['waiting'])}</td>"
        f"<td>{esc(r['culprit'])}</td><td>{times(r['vs_baseline'])}</td><td>{esc(r['baseline'])}</td>"
        f"<td>{_pct(r['matched'])}</td><td>{esc(r['cause'])}</td></tr>" for r in rows)
    return ('<h2>Communication: transfer vs waiting for a late rank</h2><p>transfer: the last arriver\'s time in each '
            'matched collective; waiting: the rest, spent by earlier ranks; shares of end-to-end time, averaged over '
            'ranks. Baseline: what a call of that size takes with no one late (a sweep of this machine, or the '
            'trace\'s own fastest calls).</p><table id="communication-cause"><tr><th>phase</th><th>class</th>'
            '<th>transfer</th><th>waiting</th><th>culprit</th><th>transfer / baseline</th><th>baseline from</th>'
            f'<th>calls matched</th><th>causes flagged</th></tr>{body}</table>')


def headroom_rows(result: dict) -> list[dict]:
    """Per phase and calibrated backend: what switching every collective to it would save per
    window (µs; negative: it would cost), the share of the phase's time, and the best backend."""
    h = result.get("headroom") or {}
    rows = []
    for ph, p in (h.get("phases") or {}).items():
        for b, s in p["backends"].items():
            rows.append({"phase": ph, "backend": b, "best": b == p["best"], "own": b == h.get("own_backend"),
                         "saved_us": s["saved_us_per_window"], "share": s["share"],
                         "covered": f"{s['covered']}/{s['calls']}", "e2e_us": p["e2e_us_per_window"]})
    return rows


def headroom_section(result: dict) -> str:
    """What switching would save, per phase and backend, and per collective size (HTML)."""
    rows = headroom_rows(result)
    if not rows:
        return ""
    h = result["headroom"]
    body = "".join(
        f"<tr><th>{esc(r['phase'])}</th><td>{esc(r['backend'])}{' (this trace)' if r['own'] else ''}"
        f"{' ★' if r['best'] else ''}</td><td>{_us(r['e2e_us'])}</td><td>{_us(r['saved_us'])}</td>"
        f"<td>{_pct(r['share'])}</td><td>{esc(r['covered'])}</td></tr>" for r in rows)
    coll = "".join(
        f"<tr><td>{esc(c['op'])}</td><td>{esc(c['axis'])}</td><td>{c['group_size']}</td><td>{c['bytes_bucket']}</td>"
        f"<td>{c['calls']}</td><td>{_us(c['achieved_us'])}</td><td>{esc(c['best_backend'] or '–')}</td>"
        f"<td>{_us((c['calibrated_us'] or {}).get(c['best_backend']))}</td><td>{_us(c['headroom_us'])}</td></tr>"
        for c in h.get("collectives") or [])
    notes = "".join(f"<p class='note'>{esc(n)}</p>" for n in h.get("notes") or [])
    return ('<h2>What switching would save</h2><p>Per phase, per window (a decode window is one token): '
            f'{esc(h["rule"])}. Calibration: {esc(h.get("calibration"))}.</p>{notes}'
            '<table id="headroom"><tr><th>phase</th><th>backend</th><th>µs per window</th><th>saved µs per window'
            '</th><th>share</th><th>calls calibrated</th></tr>' + body + '</table>'
            '<table id="headroom-collectives"><tr><th>op</th><th>axis</th><th>ranks</th><th>≤ bytes</th><th>calls</th>'
            '<th>achieved µs</th><th>best backend</th><th>its µs</th><th>headroom µs per call</th></tr>'
            + coll + '</table>')
