"""rocprofv3 rocpd databases (issue: Nsight and rocprofv3 exports): a database laid out as AMD
documents it (uuid-suffixed tables, unsuffixed views over them; ROCm/rocprofiler-sdk
rocpd_tables.sql / rocpd_views.sql, schema_version 3), filled with the NCCL scenario of
test_nsys.py, analyzes exactly like that scenario written as Kineto JSON. No database written by
rocprofv3 itself is among the shared traces: the columns follow the documented schema."""

from __future__ import annotations

import json
import sqlite3

from commprobe.analyzers.analysis import analyze
from tests.conftest import run_cli
from tests.test_nsys import ORIGIN, _comparable, scenario, write_kineto

UUID = "_00000000_0000_0000_0000_000000000001"
DDL = {  # the documented columns this reader uses (and a few it does not), in each table
    "rocpd_metadata": "id INTEGER PRIMARY KEY AUTOINCREMENT, tag TEXT NOT NULL, value TEXT NOT NULL",
    "rocpd_string": "id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT, string TEXT NOT NULL UNIQUE",
    "rocpd_info_node": "id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT, hash BIGINT, machine_id TEXT, "
                       "hostname TEXT",
    "rocpd_info_process": "id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT, nid INTEGER, ppid INTEGER, "
                          "pid INTEGER NOT NULL, command TEXT, environment JSONB DEFAULT '{}' NOT NULL",
    "rocpd_info_kernel_symbol": "id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT, nid INTEGER, pid INTEGER, "
                                "code_object_id INTEGER, kernel_name TEXT, display_name TEXT",
    "rocpd_track": "id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT, nid INTEGER, ppid INTEGER, pid INTEGER, "
                   "tid INTEGER, agent_id INTEGER, queue_id INTEGER, stream_id INTEGER, name_id INTEGER",
    "rocpd_timestamp": "id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT, value BIGINT NOT NULL, phase INTEGER, "
                       "track_id INTEGER",
    "rocpd_event": "id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT, category_id INTEGER, stack_id INTEGER, "
                   "parent_stack_id INTEGER, correlation_id INTEGER",
    "rocpd_region": "id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT, track_id INTEGER NOT NULL, "
                    "name_id INTEGER NOT NULL, start_id INTEGER NOT NULL, end_id INTEGER NOT NULL, event_id INTEGER",
    "rocpd_kernel_dispatch": "id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT, track_id INTEGER NOT NULL, "
                             "kernel_id INTEGER NOT NULL, dispatch_id INTEGER NOT NULL, start_id INTEGER NOT NULL, "
                             "end_id INTEGER NOT NULL, workgroup_size_x INTEGER, grid_size_x INTEGER, "
                             "region_name_id INTEGER, event_id INTEGER",
    "rocpd_memory_copy": "id INTEGER PRIMARY KEY AUTOINCREMENT, guid TEXT, track_id INTEGER NOT NULL, "
                         "start_id INTEGER NOT NULL, end_id INTEGER NOT NULL, name_id INTEGER NOT NULL, "
                         "dst_agent_id INTEGER, src_agent_id INTEGER, size INTEGER NOT NULL, event_id INTEGER",
}


def write_rocpd(path, rank: int, schema: str = "3") -> None:
    db = sqlite3.connect(path)
    for name, cols in DDL.items():
        db.execute(f"CREATE TABLE {name}{UUID} ({cols})")
        db.execute(f"CREATE VIEW {name} AS SELECT * FROM {name}{UUID}")
    ins = {n: f"{n}{UUID}" for n in DDL}
    db.execute(f"INSERT INTO {ins['rocpd_metadata']} (tag, value) VALUES ('schema_version', ?)", (schema,))
    db.execute(f"INSERT INTO {ins['rocpd_info_node']} (id, hash, machine_id, hostname) VALUES (1, 7, 'm', ?)",
               (f"mi300-{rank}",))
    db.execute(f"INSERT INTO {ins['rocpd_info_process']} (id, nid, pid, command, environment) VALUES (1, 1, ?, 'x', ?)",
               (5000 + rank, json.dumps({"RANK": str(rank), "WORLD_SIZE": "2"})))
    strings: dict[str, int] = {}

    def sid(s: str) -> int:
        if s not in strings:
            strings[s] = db.execute(f"INSERT INTO {ins['rocpd_string']} (string) VALUES (?)", (s,)).lastrowid
        return strings[s]

    symbols: dict[str, int] = {}
    host = db.execute(f"INSERT INTO {ins['rocpd_track']} (nid, pid, tid) VALUES (1, 1, 77)").lastrowid
    gpu = db.execute(f"INSERT INTO {ins['rocpd_track']} (nid, pid, agent_id, queue_id, stream_id) "
                     "VALUES (1, 1, 2, 1, 7)").lastrowid

    def times(e, track):
        a = db.execute(f"INSERT INTO {ins['rocpd_timestamp']} (value, phase, track_id) VALUES (?, 1, ?)",
                       (ORIGIN + e["start"], track)).lastrowid
        b = db.execute(f"INSERT INTO {ins['rocpd_timestamp']} (value, phase, track_id) VALUES (?, 2, ?)",
                       (ORIGIN + e["end"], track)).lastrowid
        return a, b

    def event(category: str, corr) -> int:
        return db.execute(f"INSERT INTO {ins['rocpd_event']} (category_id, correlation_id) VALUES (?, ?)",
                          (sid(category), corr)).lastrowid

    for n, e in enumerate(scenario(rank)):
        if e["kind"] == "kernel":
            if e["name"] not in symbols:
                symbols[e["name"]] = db.execute(f"INSERT INTO {ins['rocpd_info_kernel_symbol']} (pid, code_object_id, "
                                                "kernel_name, display_name) VALUES (1, 1, ?, ?)",
                                                (e["name"] + ".kd", e["name"])).lastrowid
            a, b = times(e, gpu)
            db.execute(f"INSERT INTO {ins['rocpd_kernel_dispatch']} (track_id, kernel_id, dispatch_id, start_id, end_id, "
                       "workgroup_size_x, grid_size_x, event_id) VALUES (?, ?, ?, ?, ?, 256, 1024, ?)",
                       (gpu, symbols[e["name"]], n, a, b, event("KERNEL_DISPATCH", e["corr"])))
        elif e["kind"] == "memcpy":
            a, b = times(e, gpu)
            db.execute(f"INSERT INTO {ins['rocpd_memory_copy']} (track_id, start_id, end_id, name_id, dst_agent_id, "
                       "src_agent_id, size, event_id) VALUES (?, ?, ?, ?, 2, 1, 1048576, ?)",
                       (gpu, a, b, sid(e["name"]), event("MEMORY_COPY", e["corr"])))
        else:
            category = ("HIP_RUNTIME_API" if e["kind"] == "runtime" else
                        "RCCL_API" if e["name"].startswith("nccl") else "MARKER_CORE_RANGE_API")
            a, b = times(e, host)
            db.execute(f"INSERT INTO {ins['rocpd_region']} (track_id, name_id, start_id, end_id, event_id) "
                       "VALUES (?, ?, ?, ?, ?)", (host, sid(e["name"]), a, b, event(category, e.get("corr"))))
    db.commit()
    db.close()


def test_a_rocpd_database_analyzes_like_the_same_scenario_in_kineto_json(tmp_path):
    kineto, roc = tmp_path / "kineto", tmp_path / "rocpd"
    kineto.mkdir()
    roc.mkdir()
    for r in (0, 1):
        write_kineto(kineto / f"rank{r}.json", r)
        write_rocpd(roc / f"{5000 + r}_results.db", r)  # rocprofv3's file name: the rank comes from RANK
    a, b = analyze(kineto), analyze(roc)
    assert _comparable(b) == _comparable(a)
    assert b["axis_provenance"] == {"tp_allreduce": {"inferred": 8}, "ep_all_to_all": {"inferred": 8}}
    assert [r["rank"] for r in b["ranks"]] == [0, 1] and b["kernel_links"]["linked"] == 16
    assert [r["identity"]["host"] for r in b["ranks"]] == ["mi300-0", "mi300-1"]  # rocpd_info_node.hostname
    # two nodes, two clocks: arrival from the time in each call, with the same straggler as one clock gives
    assert (a["collectives"]["arrival_rule"], b["collectives"]["arrival_rule"]) == ("clock", "durations")


def test_an_unknown_rocpd_schema_is_one_line(tmp_path):
    p = tmp_path / "1_results.db"
    write_rocpd(p, 0, schema="4")
    r = run_cli("analyze", str(p), "--jobs", "1")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "rocpd schema 4 is not one this version reads" in lines[0], r.stderr
