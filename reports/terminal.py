"""Terminal rendering (rich) of analyzer results. It formats; it computes nothing new."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from commprobe.common.vocab import WORK_CATEGORIES, Verdict

from .traffic_view import render_all_to_all
from .words import latency_words

CATS = WORK_CATEGORIES


HEADING = {"compute": "compute", "tp_allreduce": "TP ar", "cp_ring": "CP ring", "ep_all_to_all": "EP a2a",
           "other_comm": "oth comm", "memcpy": "copy", "other": "other"}


def breakdown_table(result: dict, wide: bool = False) -> Table:
    """Exposed time per rank and phase. Narrow enough for 100 columns without cutting a number:
    short headings, ms where a window's µs run to five digits, and (unless `wide`) only the
    categories some rank spends time in; the others are named in the caption."""
    rows = [(r["rank"], ph, p) for r in result["ranks"] for ph, p in r["phases"].items()]
    per_window = [p["e2e_us"] / max(1, p["windows"]) for _, _, p in rows]
    ms = bool(per_window) and max(per_window) >= 10_000
    unit, scale = ("ms", 1e-3) if ms else ("µs", 1.0)
    cats = [c for c in CATS if wide or c == "compute"
            or any(p["categories"][c]["exposed_us"] > 0 for _, _, p in rows)]
    empty = [c for c in CATS if c not in cats]
    caption = f"no time in: {', '.join(empty)} (--wide shows every category)" if empty else None
    kinds = {r.get("timeline") for r in result["ranks"]}
    idle = "outside ops" if kinds == {"host"} else "idle" if kinds == {"device"} else "idle / outside ops"
    means = sorted({r["idle_means"] for r in result["ranks"] if r.get("idle_means")})
    caption = "; ".join(x for x in (caption, *means) if x) or None
    table = Table(title=f"Exposed time per rank and phase ({unit} per window, % of end-to-end)", caption=caption)
    for col in ("rank", "phase", f"e2e {unit}", *(HEADING[c] for c in cats), idle):
        table.add_column(col, justify="right", no_wrap=True)

    def cell(us: float, w: int, e2e: float) -> str:
        v = us / w * scale
        return f"{v:.1f} {us / e2e:.0%}" if ms else f"{v:.0f} {us / e2e:.0%}"

    for rank, phase, p in rows:
        w, e2e = max(1, p["windows"]), p["e2e_us"] or 1.0
        table.add_row(str(rank), phase, f"{p['e2e_us'] / w * scale:.1f}" if ms else f"{p['e2e_us'] / w:.0f}",
                      *(cell(p["categories"][c]["exposed_us"], w, e2e) for c in cats), cell(p["idle_us"], w, e2e))
    return table


def cause_table(result: dict) -> Table | None:
    """Per phase: transfer vs waiting for a late rank (the split behind the verdict)."""
    from .sections import cause_rows

    rows = cause_rows(result)
    if not rows:
        return None
    t = Table(title="Communication: transfer vs waiting (% of end-to-end)",
              caption="baseline: a call's time with no one late (sweep, or the trace's fastest calls)")
    for col in ("phase", "class", "transfer", "waiting", "culprit", "vs base", "causes"):
        t.add_column(col, justify="right" if col in ("transfer", "waiting", "vs base") else "left", no_wrap=col != "causes")
    for r in rows:
        t.add_row(r["phase"], r["class"], f"{r['transfer']:.0%}", f"{r['waiting']:.0%}", r["culprit"],
                  "–" if r["vs_baseline"] is None else f"{r['vs_baseline']:.2f}×", r["cause"])
    return t


def headroom_table(result: dict) -> Table | None:
    """Per phase and calibrated backend: what switching would save per window."""
    from .sections import headroom_rows

    rows = headroom_rows(result)
    if not rows:
        return None
    t = Table(title="What switching would save (per window; a decode window is one token)",
              caption="transfer and the waiting its transport carried over, less the backend's calibrated cost; "
                      "★ best, negative: it would cost")
    for col in ("phase", "backend", "µs per window", "saved µs", "share", "calls calibrated"):
        t.add_column(col, justify="left" if col in ("phase", "backend") else "right", no_wrap=True)
    for r in rows:
        t.add_row(r["phase"], escape(r["backend"]) + (" (this trace)" if r["own"] else "") + (" ★" if r["best"] else ""),
                  f"{r['e2e_us']:,.0f}", f"{r['saved_us']:,.0f}", f"{r['share']:.0%}", r["covered"])
    return t


def render_trace_whatif(doc: dict, console: Console) -> None:
    """`plan --from PATH --what-if ...`: each phase measured, saved and predicted."""
    sw = doc["switch"]
    console.print(f"[bold]what if[/] {escape(sw['what'])} → {escape(sw['backend'])} in {escape(doc['from'])} "
                  f"(now {escape(str(doc['own_backend'] or 'unknown'))}; calibration: {escape(str(doc['calibration']))})",
                  highlight=False)
    t = Table(caption=escape(doc["rule"]))
    for col in ("phase", "trace µs/window", "saved µs", "predicted µs", "un-profiled", "predicted", "calls"):
        t.add_column(col, justify="left" if col == "phase" else "right", no_wrap=True)
    for ph, p in doc["phases"].items():
        m = p.get("metric")
        t.add_row(ph, f"{p['trace_us_per_window']:,.0f}", f"{p['saved_us_per_window']:,.0f}",
                  f"{p['predicted_us_per_window']:,.0f}",
                  f"{m.upper()} {p['measured_ms']:.3f} ms" if m else "–",
                  _predicted(p) if m else "–", f"{p['covered']}/{p['calls']}")
    console.print(t)
    for ph, p in doc["phases"].items():
        if p.get("unprofiled_rule"):
            console.print(f"{ph} un-profiled: {escape(p['unprofiled_rule'])}"
                          + (f" ({p['unprofiled_ratio']:.2f})" if p.get("unprofiled_ratio") else ""), highlight=False)
    for n in doc.get("notes") or []:
        console.print(f"note: {escape(n)}", highlight=False)


def _predicted(row: dict) -> str:
    """"35.100 ms (33.0–37.4, 90 % over 7 rounds)": a phase's prediction and its interval."""
    p, iv = row.get("predicted_ms"), row.get("interval")
    if p is None:
        return "–"
    if not iv or row.get("low_ms") is None:
        return f"{p:.3f} ms"
    return f"{p:.3f} ms ({row['low_ms']:.3f}–{row['high_ms']:.3f}, {iv['level']:.0%} over {iv['errors']} rounds)"


def render_calibration(doc: dict, where: str, console: Console) -> None:
    """`commprobe calibrate`: the rounds run and how well they predict one another."""
    done = len(doc["rounds"])
    console.print(f"calibration: {done} of {doc['rounds_asked']} rounds ({doc['status']}) in {escape(where)}",
                  highlight=False)
    summary = (doc.get("cross_validation") or {}).get("summary") or {}
    t = Table(title="each round predicted from the others (measured / predicted - 1)")
    for col in ("switch", "phase", "rounds", "median error", "within 10 %", "interval (90 %)"):
        t.add_column(col, justify="left" if col in ("switch", "phase") else "right", no_wrap=True)
    for pair, by in summary.items():
        for ph, s in by.items():
            iv = s["relative_interval"]
            t.add_row(escape(pair.replace("->", " → ")), ph, str(s["rounds"]), f"{s['median_error']:+.1%}",
                      f"{s['within_10pct']}/{s['rounds']}", "too few rounds" if iv is None else
                      f"{iv[0]:+.1%} … {iv[1]:+.1%}")
    if summary:
        console.print(t)
    else:
        console.print("no round could be predicted from the others (two rounds at least are needed)")
    b = doc["backends"]
    console.print(f"next: commprobe plan --from RUN --what-if backend={b[1]} --calibration {escape(where)}"
                  f"   # RUN: a {b[0]} bundle of this job", highlight=False)


def render_layout_whatif(doc: dict, console: Console) -> None:
    """`plan --from BUNDLE --what-if tp=N`: measured, the model at both layouts, predicted."""
    sw = doc["switch"]
    console.print(f"[bold]what if[/] {sw['what']}={sw['value']} in {escape(doc['from'])} "
                  f"(now TP{doc['layout']['tp']} CP{doc['layout']['cp']} EP{doc['layout']['ep']})", highlight=False)
    t = Table(caption=escape(doc["rule"]))
    for col in ("phase", "measured", "model now", "model then", "predicted"):
        t.add_column(col, justify="left" if col == "phase" else "right", no_wrap=True)
    for ph, p in doc["phases"].items():
        t.add_row(f"{ph} ({p['metric'].upper()})", f"{p['measured_ms']:.3f} ms", f"{p['model_base_ms']:.3f} ms",
                  f"{p['model_alt_ms']:.3f} ms", _predicted(p))
    console.print(t)
    for n in doc.get("notes") or []:
        console.print(f"note: {escape(n)}", highlight=False)


def render_analysis(result: dict, console: Console, wide: bool = False) -> None:
    src = result["source"]
    console.print(f"[bold]commprobe analyze[/]: {escape(src['path'])} ({len(src['files'])} rank trace(s), "
                  f"{src['uncompressed_bytes'] / 1e6:.1f} MB, {result['elapsed_s']:.2f} s)", highlight=False)
    formats = src.get("formats") or {}
    if set(formats) - {"kineto json"}:
        console.print("read as: " + ", ".join(f"{escape(f)} ({n} rank(s))" for f, n in formats.items()), highlight=False)
    for note in src.get("reader_notes", ()):
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    for phase, p in result["phases"].items():
        style = {Verdict.COMMUNICATION: "bold red", Verdict.HOST: "bold yellow", Verdict.DATA_MOVEMENT: "bold yellow",
                 Verdict.IMBALANCE: "bold magenta", Verdict.MIXED: "bold magenta"}.get(p["verdict"], "bold green")
        console.print(f"[{style}]{escape(p['summary'])}[/]", highlight=False)
        for rec in p["recommendations"]:
            console.print(f"  - {escape(rec)}", highlight=False)
        for note in p.get("notes", []):
            console.print(f"  note: {escape(note)}", highlight=False)
    render_all_to_all(result, console)
    console.print(breakdown_table(result, wide))
    split = cause_table(result)
    if split is not None:
        console.print(split)
    room = headroom_table(result)
    if room is not None:
        console.print(room)
    coll = result["collectives"]
    if coll["matched_calls"]:
        sr = coll.get("straggler_rule") or {}
        who = (f"; straggler: rank {coll['straggler']} ({sr['share']:.0%} of the waiting)" if coll["straggler"] is not None
               else f"; no straggler: rank {sr['most_waiting_caused_by']} caused {sr['share']:.0%} of the waiting, "
                    + _short_of(sr)
               if sr.get("most_waiting_caused_by") is not None else "")
        t = Table(title=f"Collectives matched across ranks: {coll['matched_calls']} calls{who}")
        t.caption = "wait: µs spent waiting for the last rank to arrive"
        for col in ("rank", "calls", "transfer µs", "wait µs", "times last"):
            t.add_column(col, justify="right", no_wrap=True)
        for r in coll["ranks"]:
            t.add_row(str(r["rank"]), str(r["calls"]), f"{r['transfer_us']:.0f}", f"{r['wait_us']:.0f}", str(r["times_last"]))
        console.print(t)
        if coll.get("group_rule"):
            console.print(escape(f"note: {coll['group_rule']}"), highlight=False)
    if result["message_sizes"]:
        from commprobe.common.units import human_size

        mark = {"inferred": "*", "unknown": "?"}
        t = Table(title="Collective latency by message size", caption="axis: * inferred from the op, ? unknown; "
                  "bus bandwidth in GB/s" + ("" if wide else " (--wide: algorithm bandwidth too)"))
        cols = ("op", "axis", "≤ size", "count", "median µs", "p90 µs", *(("algbw",) if wide else ()), "busbw")
        for col in cols:
            t.add_column(col, justify="right", no_wrap=True)
        for b in result["message_sizes"]:
            t.add_row(escape(b["op"]), b["axis"] + mark.get(b.get("axis_source", ""), ""), human_size(b["bucket_bytes"]),
                      str(b["count"]), f"{b['median_us']:.1f}", f"{b['p90_us']:.1f}",
                      *((f"{b['algbw_GBps']:.2f}",) if wide else ()), f"{b['busbw_GBps']:.2f}")
        console.print(t)
    links = result.get("kernel_links") or {}
    if links.get("comm_kernels"):
        console.print(f"communication kernels linked to their host op: {links['linked']} of {links['comm_kernels']} "
                      f"(no launch in the trace: {links['no_launch']}, outside any host collective: "
                      f"{links['outside_host_op']})", highlight=False)
    u = result["unclassified"]
    if u["count"]:
        names = ", ".join(escape(n["name"][:40]) for n in u["names"][:5])
        console.print(f"unclassified events: {u['count']} ({names}…); add a --rules file to classify them", highlight=False)


def render_hang(result: dict, console: Console) -> None:
    """The hang diagnosis (commprobe.hang/2): the root cause is the first line; each root's
    stacks, then the groups blocked behind it, one line each."""
    roots = result["findings"]
    if roots:
        f = roots[0]
        console.print(f"[bold red]root cause ({escape(f['kind'])})[/]: {escape(f['summary'])}", highlight=False)
    console.print(f"[bold]commprobe hang[/]: {escape(result['source'])} (records of ranks "
                  f"{', '.join(map(str, result['ranks'])) or 'none'})", highlight=False)
    if not roots:
        console.print("[green]no finding: every group's ranks agree and none is stuck in a collective[/]")
    for i, f in enumerate(roots):
        if i:
            console.print(f"[bold red]another root ({escape(f['kind'])})[/]: {escape(f['summary'])}", highlight=False)
        table = Table(show_header=True, header_style="bold", box=None)
        for col in ("rank", "role", "where (file:line, function)"):
            table.add_column(col)
        for r, s in f["stacks"].items():
            role = ("stalled" if r in f.get("stalled", {}) else "missing" if int(r) in f["missing"]
                    else "waits" if int(r) in f["concerned"] else "")
            at = f"{s['file']}:{s['line']} ({s['name']})" if s else "?"
            table.add_row(r, role, escape(at))
        console.print(table)
        cons = f.get("consequences", [])
        if cons:
            console.print(f"  {len(cons)} group(s) blocked behind it (consequences, not causes):", highlight=False)
        for c in cons:
            console.print(f"  - {escape(c['kind'])} {escape(c['axis'] or '')} group {c['ranks']}: "
                          f"{escape(c['summary'])}", highlight=False)
    for n in result.get("notes", ()):
        console.print(f"[yellow]note:[/] {escape(n)}", highlight=False)


def render_compare(result: dict, console: Console) -> None:
    console.print(f"[bold]commprobe compare[/]: A = {escape(result['a'])}, B = {escape(result['b'])} (ratio B/A)")
    lat = result.get("latency") or {}
    for m in ("ttit", "ttft"):
        if m in lat or (m == "ttit" and lat.get("note")):
            console.print(escape(latency_words(lat, m, "B")), highlight=False)
    t = Table(title="Per phase (µs per window)")
    for col in ("phase", "category", "A", "B", "B/A"):
        t.add_column(col, justify="right")
    for ph, p in result["phases"].items():
        t.add_row(ph, "end-to-end", f"{p['a_e2e_us']:.0f}", f"{p['b_e2e_us']:.0f}", _r(p["ratio"]))
        for c, v in p["categories"].items():
            if v["a_us"] or v["b_us"]:
                t.add_row("", c, f"{v['a_us']:.0f}", f"{v['b_us']:.0f}", _r(v["ratio"]))
        split = p.get("split") or {}
        if "a" in split and "b" in split:  # shares of end-to-end, as the analyses wrote them
            for part, key in (("  of it transfer", "transfer_share"), ("  of it waiting", "wait_share")):
                a, b = split["a"][key] or 0.0, split["b"][key] or 0.0
                t.add_row("", f"{part} (% e2e)", f"{a:.0%}", f"{b:.0%}", "")
        if p["a_verdict"] != p["b_verdict"]:
            t.add_row("", "verdict", p["a_verdict"], p["b_verdict"], "")
    console.print(t)
    if result["message_sizes"]:
        t = Table(title="Collective median latency by message size")
        for col in ("op", "≤ bytes", "A µs", "B µs", "B/A"):
            t.add_column(col, justify="right")
        for r in result["message_sizes"]:
            t.add_row(escape(r["op"]), str(r["bucket_bytes"]), f"{r['a_median_us']:.1f}", f"{r['b_median_us']:.1f}", _r(r["ratio"]))
        console.print(t)


def _r(x) -> str:
    return f"{x:.2f}x" if x is not None else "-"


# ---- tables of `commprobe profile` and `commprobe bench` ----

def render_profile(results: list, backends: list[str], axes: list[str], console: Console) -> None:
    """Per backend, TTFT/TTIT/tokens/s per rank and the share blocked in each axis's collectives
    (probe.run.RankResult rows: their timings are what the ranks measured)."""
    for b in backends:
        table = Table(title=f"Latency per rank and phase, backend {b} (un-profiled; comm % = blocked in that axis's collectives)")
        table.caption = "TTIT: median and p90 ms; pre/dec AXIS %: prefill/decode time blocked in that axis's collectives"
        cols = ["rank", "TTFT ms", "TTIT ms", "p90 ms", "tok/s"]
        cols += [f"pre {a} %" for a in axes] + [f"dec {a} %" for a in axes] + ["MB"]
        for col in cols:
            table.add_column(col, justify="right", no_wrap=True)
        for res in results:
            r = res.timings[b]
            table.add_row(str(r.rank), f"{r.ttft_median_ms:.1f}", f"{r.ttit_median_ms:.2f}", f"{r.ttit_p90_ms:.2f}",
                          f"{r.tokens_per_s:.1f}", *[f"{100 * r.comm_share('prefill', a):.1f}" for a in axes],
                          *[f"{100 * r.comm_share('decode', a):.1f}" for a in axes],
                          f"{res.local_param_bytes / 1e6:.0f}")
        console.print(table)


def render_next_steps(out: str, verdicts: dict[str, dict | str], console: Console, source: str = "profile") -> None:
    """The run's verdict (per backend and phase, from each sub-bundle's analysis `phases`) and
    the commands that dig further, the way git says what to do next. A backend maps to its
    phases, or to why there is no analysis. `source`: what wrote the bundle (`profile` of our
    reference model, or `capture` of a user's server): the next steps fit what was read."""
    console.print(f"bundle: {out}", highlight=False, markup=False, soft_wrap=True)
    console.print("verdict:", highlight=False, markup=False)
    for b, phases in verdicts.items():
        if isinstance(phases, str):
            console.print(f"  {b}: no analysis ({phases})", highlight=False, markup=False)
            continue
        for ph, p in phases.items():
            console.print(f"  {b:<5} {ph:<8} {p['verdict']:<20} exposed communication {p['exposed_comm_share']:.0%}; "
                          f"largest: {p.get('largest', p['dominant'])} {p.get('largest_share', p['dominant_share']):.0%}", highlight=False, markup=False)
    subs = list(verdicts)
    one = out if len(subs) == 1 else f"{out}/{subs[0]}"
    steps = [(f"commprobe analyze {one}", "where the time goes per rank; collectives matched across ranks"),
             (f"commprobe report {out} -o report.html", "one HTML page: breakdown, timelines, telemetry")]
    if len(subs) > 1:
        steps.append((f"commprobe compare {out}/{subs[0]} {out}/{subs[1]}", f"{subs[1]} against {subs[0]}, B/A"))
    elif source == "capture":
        steps.append((f"commprobe report {out} AFTER -o compare.html",
                      "capture again after a change (into AFTER), then compare the two, B/A"))
    else:
        steps.append(("commprobe profile --backend gloo,dda --out runs/ab", "then compare runs/ab/gloo runs/ab/dda"))
    console.print("next:", highlight=False, markup=False)
    width = max(len(c) for c, _ in steps)
    for cmd, why in steps:
        console.print(f"  {cmd:<{width}}  # {why}", highlight=False, markup=False, soft_wrap=True)  # copyable


def render_sweep(res: dict, ops: list[str], world: int, dtype: str, batches: int, console: Console) -> None:
    from commprobe.common.units import human_size

    load = res.get("load", 0)
    beside = f", beside {load} busy process{'es' if load != 1 else ''}" if load else ""
    ref_name = next((r["vs"]["backend"] for r in res["rows"] if r.get("vs")), "dda")
    table = Table(title=f"{', '.join(ops)} sweep, world {world}, {dtype}{beside} (median of {batches} batches)")
    for col in ("op", "size", "count", "backend", "time_us", "p10-p90 us", "algbw GB/s", "busbw GB/s",
                f"vs {ref_name}"):
        table.add_column(col, justify="right", no_wrap=True)
    noise = False
    for r in res["rows"]:
        vs = r.get("vs")
        cell = ""
        if vs:
            cell = f"{vs['ratio']:.2f}x ({vs['low']:.2f}-{vs['high']:.2f})"
            if not vs["beyond_noise"]:
                cell, noise = cell + " ~", True
        p10, p90 = r.get("p10_us"), r.get("p90_us")
        table.add_row(r["op"], human_size(r["bytes"]), str(r["count"]), r["backend"], f"{r['time_us']:.1f}",
                      f"{p10:.1f}-{p90:.1f}" if p10 is not None and p90 is not None else "",
                      f"{r['algbw_GBps']:.2f}", f"{r['busbw_GBps']:.2f}", cell)
    console.print(table)
    console.print(f"single-thread copy bandwidth: {res['copy_GBps']:.1f} GB/s (bytes copied per second); "
                  f"'vs {ref_name}' = backend time / {ref_name} time, medians (the range: p10/p90 against p90/p10)"
                  + ("; '~': the two ranges overlap, no difference beyond the noise" if noise else ""),
                  highlight=False)


def render_time_sharing(rows: list[dict], world: int, cores: int, backend: str, size: str, rounds: int,
                        console: Console) -> None:
    import statistics

    from commprobe.common.units import human_size

    table = Table(title=f"time-sharing: {world} ranks on {cores} cores, {backend} allreduce of {size} after each "
                  f"piece of work (medians of {rounds} alternated rounds)")
    for col in ("work", f"{cores} ranks µs/call", f"{world} ranks µs/call", "interval µs", "extra µs/call"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in rows:
        table.add_row(human_size(r["work_bytes"]), f"{statistics.median(r['base_us']):.0f}",
                      f"{statistics.median(r['shared_us']):.0f}", f"{r['interval_us']:.0f}", f"{r['extra_us']:.0f}")
    console.print(table)
    console.print("extra = (all ranks - ranks/cores x one per core) / (ranks/cores - 1); "
                  "`commprobe plan calibrate` reads the --json rows", highlight=False)


def render_diagnosis(res: dict, console: Console) -> None:
    """`commprobe bench diagnosis`: every case, the confusion matrix, accuracy, time found vs
    injected and the smallest dose detected per cause."""
    t = Table(title="Cases (expected cause/culprit → given; verdict of the scored phase)")
    for col in ("", "layout", "backend", "fault", "dose", "expected", "given", "verdict", "other work"):
        t.add_column(col, no_wrap=col != "verdict")
    for c in res["cases"]:
        exp = c["expect"] + (f" r{c['culprit']}" if c["culprit"] is not None else "")
        got = c["given"] + (f" r{c['given_culprit']}" if c["given_culprit"] is not None else "")
        other = (c.get("numbers") or {}).get("other_cores")
        t.add_row("ok" if c["right"] else "[red]WRONG[/]", c["layout"], c["backend"], escape(c["spec"] or "healthy"),
                  c["dose_name"], exp, got, escape(c["verdict"]), "–" if other is None else f"{other:.2f} cores")
    console.print(t)
    console.print("other work: CPU cores other processes (and the hypervisor's steal) took while the case ran; "
                  "on a contended host no slower transport is named", highlight=False)
    labels = list(res["matrix"])
    m = Table(title="Confusion matrix: expected (rows) vs given (columns)")
    m.add_column("expected \\ given")
    for g in labels:
        m.add_column(g, justify="right")
    for e in labels:
        m.add_row(e, *(str(res["matrix"][e][g]) for g in labels))
    console.print(m)
    if res["time_found"]:
        f = Table(title="Time found vs injected (µs per window; found = faulty run minus healthy run)")
        for col in ("fault", "layout", "backend", "injected", "found", "error"):
            f.add_column(col, justify="right" if col in ("injected", "found", "error") else "left")
        for r in res["time_found"]:
            f.add_row(escape(r["spec"]), r["layout"], r["backend"], f"{r['injected_us']:.0f}", f"{r['found_us']:.0f}",
                      f"{r['error']:+.1%}")
        console.print(f)
    s = Table(title="Smallest dose detected")
    s.add_column("cause (layout, backend)")
    s.add_column("smallest dose detected")
    for k, v in res["smallest_detected"].items():
        s.add_row(k, escape(v["spec"]) if v["spec"] else "[red]none[/]")
    console.print(s)
    console.print(f"accuracy {res['accuracy']:.1%} ({res['right']}/{res['total']} right on cause, culprit and axis); "
                  f"healthy runs flagged: {res['healthy_flagged']} of {res['healthy']}; {res['seconds']:.0f} s",
                  highlight=False)


def _short_of(sr: dict) -> str:
    """Why the rank that caused most is not named (the straggler rule's two tests)."""
    lead, z = sr.get("lead"), sr.get("z")
    if lead is not None and lead < sr["lead_needed"]:
        return f"{lead:.2g}x the next rank's, under the {sr['lead_needed']:g}x needed to be named"
    return (f"a lead within the noise ({z:.1f} standard errors, {sr['z_needed']:g} needed)" if z is not None
            else "too few calls to tell a lead from the noise")
