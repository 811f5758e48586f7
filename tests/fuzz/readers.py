"""Fuzzing the readers added after the Kineto one: Nsight / rocpd / RPD SQLite, rocprofv3 JSON,
Flight Recorder dumps (pickle and JSON), engines' file names and --rank-from. One property for all:
the input analyzes, or is refused with the project's one InputError in one line; never another
exception, never more than CASE_LIMIT_S.

Typed mutations of small seed files (made here from the real schemas, so a case costs milliseconds):
for SQLite, a column of some rows set to NULL / text / a real / 1e300 / a huge or negative integer /
a blob of bad UTF-8, a table dropped, a column dropped, a table replaced by a view to nowhere, pages
overwritten; for JSON and pickles, a value replaced by another type, nesting deepened, integers of
thousands of digits, infinities, opcodes that run code, memo tricks. `run(target, n, seed)` runs n
cases; tests/test_fuzz_readers.py runs a few hundred, bench/fuzz.py --readers the long run.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import random
import shutil
import sqlite3
import time
from collections import Counter
from pathlib import Path

from commprobe.analyzers.analysis import analyze
from commprobe.common.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "data" / "traces"
CASE_LIMIT_S = 10.0
HOSTILE = [None, "text", "", 3.5, 1e300, -1, 0, (1 << 63) - 1, -(1 << 63), b"\xff\xfe\x00", "\udc80x", "é" * 300]


# --- seeds -------------------------------------------------------------------------------------

def seeds(work: Path) -> dict[str, Path]:
    """One small seed file per SQLite/JSON format, from the real schemas (made once per run)."""
    from tests.test_nsys import write_nsys
    from tests.test_rocpd import write_rocpd

    out = {}
    write_nsys(work / "seed.sqlite")
    out["nsys"] = work / "seed.sqlite"
    write_rocpd(work / "seed_results.db", 0)
    out["rocpd"] = work / "seed_results.db"
    rpd = work / "seed.rpd"
    with gzip.open(REAL / "amd" / "rpd_vllm_mi300_mytrace.rpd.gz") as f, open(rpd, "wb") as w:
        shutil.copyfileobj(f, w)
    db = sqlite3.connect(rpd)
    for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'rocpd_%'").fetchall():
        if t not in ("rocpd_metadata", "rocpd_string"):
            db.execute(f'DELETE FROM "{t}" WHERE rowid > (SELECT min(rowid) FROM "{t}") + 200')
    db.commit()
    db.execute("VACUUM")
    db.close()
    out["rpd"] = rpd
    with gzip.open(REAL / "amd" / "rocprofv3_mi350_pid908_results.json.gz", "rt") as f:
        doc = json.load(f)
    _shrink(doc, 60)
    (work / "seed_results.json").write_text(json.dumps(doc))
    out["rocprof-json"] = work / "seed_results.json"
    return out


def _shrink(o, keep: int) -> None:
    """Every list in the document cut to its first `keep` items (a small seed of the same shape)."""
    if isinstance(o, dict):
        for v in o.values():
            _shrink(v, keep)
    elif isinstance(o, list):
        del o[keep:]
        for v in o:
            _shrink(v, keep)


# --- mutations ---------------------------------------------------------------------------------

def mutate_sqlite(seed: Path, out: Path, rng: random.Random) -> str:
    """A copy of the seed with one to three typed mutations; returns what was done."""
    shutil.copyfile(seed, out)
    db = sqlite3.connect(out)
    done = []
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
              if not r[0].startswith("sqlite_")]
    for _ in range(rng.randint(1, 3)):
        t = rng.choice(tables)
        cols = [r[1] for r in db.execute(f'PRAGMA table_info("{t}")').fetchall()]
        kind = rng.random()
        try:
            if kind < 0.7 and cols:
                c, v = rng.choice(cols), rng.choice(HOSTILE)
                k = rng.randint(1, 5)
                if isinstance(v, str) and "\udc80" in v:
                    v = v.encode("utf-8", "surrogateescape")  # bytes that are not UTF-8, stored as TEXT
                    db.execute(f'UPDATE "{t}" SET "{c}" = CAST(? AS TEXT) WHERE rowid % ? = 0', (v, k))
                else:
                    db.execute(f'UPDATE "{t}" SET "{c}" = ? WHERE rowid % ? = 0', (v, k))
                done.append(f"{t}.{c}={v!r:.20}/{k}")
            elif kind < 0.8:
                db.execute(f'DROP TABLE "{t}"')
                done.append(f"drop {t}")
                tables.remove(t)
            elif kind < 0.9 and len(cols) > 1:
                c = rng.choice(cols)
                db.execute(f'ALTER TABLE "{t}" DROP COLUMN "{c}"')
                done.append(f"drop {t}.{c}")
            else:
                db.execute(f'DROP TABLE "{t}"')
                for stmt in _hostile_view(t, cols, rng):
                    db.execute(stmt)
                done.append(f"view {t}")
                tables.remove(t)
        except sqlite3.Error as e:  # a constraint, a column a view needs: the mutation is skipped
            done.append(f"({type(e).__name__})")
    db.commit()
    db.close()
    if rng.random() < 0.15:  # pages overwritten past the header
        data = bytearray(out.read_bytes())
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(100, len(data))
            data[i:i + 16] = rng.randbytes(16)
        out.write_bytes(bytes(data))
        done.append("pages")
    return ", ".join(done)


def _hostile_view(table: str, cols: list[str], rng: random.Random) -> list[str]:
    """The statements that put a view in a table's place: one of nothing that exists, a recursive
    CTE that never ends (with the table's own columns, so every reader's query gets past its column
    checks), one that ends after a million rows, or a view of itself through another (circular)."""
    sel = ", ".join(f'x AS "{c}"' for c in cols) or "x"
    kind = rng.randrange(4)
    view = f'CREATE VIEW "{table}" AS '
    if kind == 0:
        return [view + f"SELECT * FROM nowhere_{rng.randint(0, 9)}"]
    if kind == 1:
        return [view + f"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT {sel} FROM c"]
    if kind == 2:
        return [view + f"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1000000) "
                       f"SELECT {sel} FROM c"]
    return [view + f'SELECT * FROM "{table}_again"', f'CREATE VIEW "{table}_again" AS SELECT * FROM "{table}"']


def _hostile_json(rng: random.Random):
    return rng.choice([None, "x", 3.5, -1, 1 << 70, [], {}, True, "\u0000", 10 ** 400, [[[[[]]]]], {"a": {"b": {}}}])


def mutate_doc(o, rng: random.Random, depth: int = 0, rate: float | None = None):
    """A JSON-like value with a few leaves or containers replaced by values of other types (`rate`:
    about that share of them; drawn per document, so some cases change one value, some many)."""
    rate = rng.choice([0.001, 0.01, 0.05]) if rate is None else rate
    if depth > 40:
        return o
    if isinstance(o, dict):
        out = {}
        for k, v in o.items():
            r = rng.random()
            if r < rate / 3:
                continue  # a key dropped
            out[k] = _hostile_json(rng) if r < rate else mutate_doc(v, rng, depth + 1, rate)
        return out
    if isinstance(o, list):
        return [_hostile_json(rng) if rng.random() < rate else mutate_doc(v, rng, depth + 1, rate) for v in o]
    return _hostile_json(rng) if rng.random() < rate else o


def write_json_case(doc, out: Path, rng: random.Random) -> str:
    text = json.dumps(mutate_doc(doc, rng))
    if rng.random() < 0.1:  # nesting far past any parser's recursion
        text = text[:-1] + ', "deep": ' + "[" * 50_000 + "]" * 50_000 + "}"
    if rng.random() < 0.1:
        text = text.replace("1", "9" * 5000, 1)  # an integer of 5,000 digits
    if rng.random() < 0.05:
        text = text.replace("0", "Infinity", 1)
    out.write_text(text)
    return "json"


def dump_doc(rng: random.Random, ranks: int = 2, groups: int = 1) -> dict:
    """A Flight Recorder dump in PyTorch's own shape (tests/test_hang.py builds the same)."""
    entries = [{"record_id": i, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": i + 1,
                "p2p_seq_id": 0, "op_id": i, "profiling_name": "nccl:all_reduce", "time_created_ns": 10 ** 18 + i,
                "input_sizes": [[4, 4]], "input_dtypes": ["Float"], "output_sizes": [[4, 4]], "output_dtypes": ["Float"],
                "state": "completed" if i < 3 else "started", "time_discovered_started_ns": 10 ** 18 + i,
                "time_discovered_completed_ns": None, "retired": i < 3, "timeout_ms": 600000, "is_p2p": False,
                "frames": [{"name": "step", "filename": "/job/train.py", "line": 40 + i}]} for i in range(rng.randint(1, 6))]
    return {"version": "2.10", "pg_config": {str(g): {"name": str(g), "desc": "default_pg",
                                                     "ranks": str(list(range(ranks)))} for g in range(groups)},
            "pg_status": {}, "entries": entries}


class _Payload:
    def __reduce__(self):
        return (print, ("ran",))


def write_job_case(d: Path, rng: random.Random) -> str:
    """A 16-rank NCCL MoE job's dumps (tests/fr_jobs.py: TP/PP/EP groups of 2, 4 and 16 ranks, uneven
    all-to-all, rings trimmed to a few entries), then some ranks' dumps emptied, dropped or mutated."""
    import pickle as _pickle

    from tests.fr_jobs import write_job

    how = [rng.choice(("device", "host"))]
    write_job(d, how[0], faulted=rng.choice(((5, 6), (9,), (12, 15))), seed=rng.randrange(1 << 20),
              dumpless=rng.random() < 0.2, as_json=rng.random() < 0.3, stale=rng.random() < 0.3,
              trim=rng.choice(((1, 3), (3, 43), (40, 200))))
    for p in sorted(d.iterdir()):
        x = rng.random()
        if x < 0.05:
            p.write_bytes(_pickle.dumps({"version": "2.9", "pg_config": {}, "pg_status": {}, "entries": []}))
            how.append("empty")
        elif x < 0.08:
            p.unlink()
            how.append("gone")
        elif x < 0.12:
            data = p.read_bytes()
            doc = _pickle.loads(data) if data[:1] == b"\x80" else json.loads(data)  # our own file, just written
            p.write_bytes(_pickle.dumps(mutate_doc(doc, rng)))
            how.append("mutated")
    return ",".join(how)


def write_dump_case(d: Path, rng: random.Random) -> str:
    """Two ranks' dumps, mutated: types, depth, huge integers, code-running opcodes, memo tricks; now
    and then a 16-rank job's (write_job_case)."""
    d.mkdir(parents=True, exist_ok=True)
    if rng.random() < 0.25:
        return "job:" + write_job_case(d, rng)
    how = []
    for r in (0, 1):
        # a dump of 20,000 groups now and then (it takes a second or two: the bound is seconds, not a minute)
        doc = mutate_doc(dump_doc(rng), rng) if rng.random() < 0.97 else dump_doc(rng, groups=rng.choice([1, 20_000]))
        p = d / f"nccl_trace_rank_{r}"
        kind = rng.random()
        if kind < 0.45:
            data = pickle.dumps(doc, protocol=rng.choice([2, 4, 5]))
            if rng.random() < 0.1:
                data = pickle.dumps({"entries": [_Payload()]})
                how.append("reduce")
            elif rng.random() < 0.1:  # a memo get of a slot never put, and a cut pickle
                data = data[:2] + b"h\x07" + data[2:] if rng.random() < 0.5 else data[: rng.randrange(2, len(data))]
                how.append("memo/cut")
            elif rng.random() < 0.1:
                data = b"\x80\x04" + b"]" + b"(" * 100_000 + b"."  # MARKs without end
                how.append("marks")
            p.write_bytes(data)
        else:
            write_json_case(doc, p, rng)
        how.append("pickle" if kind < 0.45 else "json")
    if rng.random() < 0.2:  # a second rank's stack file of the wrong shape
        (d / "rank0.stacks.json").write_text(json.dumps(_hostile_json(rng) if rng.random() < 0.5 else
                                                        {"stacks": _hostile_json(rng), "job": [1], "error": {}}))
        how.append("stacks")
    return ",".join(how)


# --- one case ----------------------------------------------------------------------------------

def check(target: str, rng: random.Random, work: Path, seed_files: dict[str, Path]) -> str:
    """One case of `target`: 'ok' (analyzed) or 'refused' (one InputError line); anything else
    raises AssertionError naming the case."""
    from commprobe.analyzers.hang import analyze_hang

    case = work / f"case-{target}"
    if case.exists():
        shutil.rmtree(case) if case.is_dir() else case.unlink()
    t0 = time.perf_counter()
    what = target
    try:
        if target in ("nsys", "rocpd", "rpd"):
            case.mkdir()
            f = case / seed_files[target].name
            what = mutate_sqlite(seed_files[target], f, rng)
            analyze(f)
        elif target == "rocprof-json":
            case.mkdir()
            f = case / "x_results.json"
            write_json_case(json.loads(seed_files[target].read_text()), f, rng)
            analyze(f)
        elif target == "flight-recorder":
            what = write_dump_case(case, rng)
            analyze_hang(case)
        elif target == "names":
            what = names_case(rng, case)
        else:
            raise ValueError(target)
        out = "ok"
    except InputError as e:
        if "\n" in str(e):
            raise AssertionError(f"{target} [{what}]: a two-line error: {str(e)[:200]!r}") from None
        out = "refused"
    except Exception as e:  # noqa: BLE001 - the property: nothing else
        raise AssertionError(f"{target} [{what}]: {type(e).__name__}: {str(e)[:300]}") from e
    dt = time.perf_counter() - t0
    if dt > CASE_LIMIT_S:
        raise AssertionError(f"{target} [{what}]: {dt:.1f} s (limit {CASE_LIMIT_S:.0f} s)")
    return out


def names_case(rng: random.Random, d: Path) -> str:
    """Engine file names and --rank-from patterns: random strings through the name readers and the
    rank rules over a directory of tiny traces with those names."""
    from commprobe.analyzers.cross_rank.identity import assign, compile_rank_from
    from commprobe.analyzers.readers.coordinates import in_name
    from commprobe.analyzers.readers.model import evidence

    # every Unicode digit class beside ASCII's: superscripts (No), other scripts' decimals (Nd),
    # circled and fullwidth forms, a mathematical digit outside the BMP
    alphabet = "abcdp_tprank0123456789-._()[]\\+*?{}|^$:/\n\x00é " + "²³¹٣५३①３𝟠⁰₂"
    names = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(3)]
    pattern = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) if rng.random() < 0.5 else None
    if rng.random() < 0.3:  # a group that captures a digit of another class, as a user's pattern would
        digit = rng.choice("²٣५①３𝟠₂7")
        names = [f"rank{digit}_{n}" for n in names]
        pattern = rng.choice(["(²)", r"(\d)", r"rank(.)", "(.)", r"(\d+)_", r"rank(\w)"])
    for n in names:
        in_name(n)
    try:
        compile_rank_from(pattern)
    except InputError:
        pass
    assign([evidence(n, rng.choice([None, 0, 1])) for n in names], pattern)
    return f"{names!r} {pattern!r}"


TARGETS = ("nsys", "rocpd", "rpd", "rocprof-json", "flight-recorder", "names")


def run(target: str, n: int, seed: int, work: Path, seed_files: dict[str, Path] | None = None) -> Counter:
    """n cases of `target`. A query's bound (COMMPROBE_SQL_SECONDS) is 1 s here, so that a view
    that never ends costs a case 1 s, not the default's 5 (tests/test_hostile_readers.py holds the
    default)."""
    before = os.environ.get("COMMPROBE_SQL_SECONDS")
    os.environ["COMMPROBE_SQL_SECONDS"] = before or "1"
    try:
        seed_files = seed_files or seeds(work)
        rng = random.Random(f"{target}-{seed}")
        seen: Counter = Counter()
        for _ in range(n):
            seen[check(target, rng, work, seed_files)] += 1
        return seen
    finally:
        if before is None:
            os.environ.pop("COMMPROBE_SQL_SECONDS", None)
