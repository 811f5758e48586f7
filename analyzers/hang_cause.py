"""Hang findings ranked by cause: the root first, the groups blocked behind it as its consequences.

One hang shows in many groups. A rank whose GPU stops completing work holds its expert group; the
next pipeline stage waits on its send; that stage's tensor-parallel group queues behind the recv
on the same stream and reads "every rank entered and none completed". Read per group, in name
order, the first finding is a downstream group and the user blames a link.

So each rank's *first pending* record (the earliest, in its own record order across groups, that
is not completed) says what it waits on, and following "waits on" from rank to rank ends at a
cause that waits on nothing else:
- `device`: a rank whose records leave undone a collective its peers completed (its GPU stopped
  completing work after taking part);
- `host`: a rank with nothing pending that others wait for (its host stopped issuing work: a
  stack, a GIL, a loop elsewhere), owned by the group that isolates it (the fewest missing beside it);
- `group`: a collective every member entered and is pending on with nothing else before it (a
  peer or link fault);
- `absent`: a rank that left no records others wait for (what it did cannot be told), owned as `host`;
- `finding`: a finding that is its own cause (a mismatch, a death).
A finding that owns one of these causes is a root; every other finding is a consequence of the
root its first held-back rank leads to. Roots are ordered by when the ranks parted (the earliest
record of the parting collective); where records carry no times, by group order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .hang_records import _by_seq, _completed, _index, progress
from .readers.flight_recorder import RankDump

_SELF_CAUSED = frozenset({"type_mismatch", "size_mismatch", "dtype_mismatch", "rank_died"})


@dataclass(frozen=True)
class Pending:
    """A rank's first record not completed: its group, sequence number (collectives) and the ranks
    it waits for where the record says (a send's or recv's peer); `time`: when it was created."""

    pg: str
    seq: int | None
    peers: tuple[int, ...] | None = None  # p2p: the peer's global rank; None: a collective
    time: int | None = None
    certain: bool = True  # False: a send or recv whose completion the records do not keep


_P2P_PEER = re.compile(r"(\d+)\s*(->|<-)\s*(\d+)")


def pending_of(d: RankDump, members: dict[str, list[int]]) -> list[Pending]:
    """A rank's first record, in its own record order across groups, that is not completed. Where
    no entry's state reads completed (states not kept: only pg_status tells, and it counts
    collectives only), the sends and recvs recorded after the rank's last completed collective
    may be pending or not: they come first, marked uncertain, then the first pending collective."""
    told = any(_completed(e) for e in d.entries)
    order = sorted(d.entries, key=lambda e: (e["record_id"], e["time_created_ns"] or 0))
    comp = {}

    def done(e) -> bool:
        if _completed(e):
            return True
        if e["pg_name"] not in comp:
            comp[e["pg_name"]] = progress(d, e["pg_name"])[1]
        c = comp[e["pg_name"]]
        return c is not None and 0 <= e["collective_seq_id"] <= c

    last_done = -1 if told else max((i for i, e in enumerate(order) if not e["is_p2p"] and done(e)), default=-1)
    # a collective pg_status says is pending whose record the ring no longer holds is older than
    # every record it holds: it comes first
    out = []
    for pg in sorted(_index(d)["status"]):
        enq, last = progress(d, pg)
        if enq is not None and last is not None and enq > last and (last + 1) not in _by_seq(d, pg):
            out.append(Pending(pg, last + 1, None, None))
    if out:
        return out
    for i, e in enumerate(order):
        if e["is_p2p"]:
            if _completed(e) or (not told and i < last_done):
                continue
            m = _P2P_PEER.search(e["profiling_name"])
            ranks = members.get(e["pg_name"], [])
            peer = int(m.group(3)) if m else -1
            out.append(Pending(e["pg_name"], None, (ranks[peer],) if 0 <= peer < len(ranks) else (),
                               e["time_created_ns"], certain=told))
            if told:
                return out
        elif e["collective_seq_id"] >= 0 and not done(e):
            return [*out, Pending(e["pg_name"], e["collective_seq_id"], None, e["time_created_ns"])]
    return out


def parted_at(f: dict, dumps: list[RankDump]) -> float:
    """When the ranks parted in a finding's group: the earliest record of the collective where they
    did (the first a rank left undone, for a stalled device); infinity where records carry no time."""
    seqs = set(int(q) for q in f.get("stalled", {}).values()) or {f["seq"]}
    times = []
    for d in dumps:
        for q in seqs:
            e = _by_seq(d, f["group"]).get(q)
            if e is not None and e["time_created_ns"]:
                times.append(e["time_created_ns"])
            elif e is None and d.entries and (progress(d, f["group"])[0] or 0) >= q:
                # entered, its record trimmed away: older than every record the ring still holds
                times.append(_index(d)["oldest"] - 1)
    return float(min(times)) if times else float("inf")


def _causes_of(f: dict, by_group: dict[str, dict], pending: dict[int, list[Pending]]) -> list[tuple]:
    """The causes a finding's held-back ranks lead to (its own among them where it owns one). Each
    cause is (kind, what, certain): certain False where the way to it passes a send or recv whose
    completion the records do not keep."""
    if f["kind"] in _SELF_CAUSED:
        return [("finding", id(f), True)]
    if f["kind"] == "device_stalled":
        return [("device", int(r), True) for r in f["stalled"]]
    if f["kind"] == "no_records":
        return [("absent", m, True) for m in f["missing"]]
    if f["kind"] == "missing_rank":
        return [("group", f["group"], c[2]) if c[0] == "cycle" else c
                for c in (_root(m, by_group, pending) for m in f["missing"])]
    # stuck in transfer: members pending on something before this collective hold it back
    here = (f["group"], f["seq"])
    behind = [m for m in f["concerned"] if (pending.get(m) or [None])[0] is not None
              and (pending[m][0].pg, pending[m][0].seq) != here]
    found = [c for m in behind if (c := _root(m, by_group, pending))[0] != "cycle"]
    return found or [("group", f["group"], True)]


def _first(pending: list[Pending] | None) -> Pending | None:
    """The first record a rank is known to wait on (its first pending collective; a send or recv
    only where its state is kept)."""
    return next((p for p in pending or () if p.certain), None)


def _root(r: int, by_group: dict[str, dict], pending: dict[int, list[Pending]], seen: frozenset = frozenset(),
          certain: bool = True) -> tuple:
    """The cause rank r's wait leads to, followed from rank to rank. A send or recv whose state the
    records do not keep is followed to its peer unless that comes back around (then it is taken as
    done, and the rank's next record is followed); a cycle otherwise ends where it closes."""
    if r in seen:
        return ("cycle", r, certain)
    if r not in pending:
        return ("absent", r, certain)
    seen = seen | {r}
    waits = pending.get(r) or []
    if not waits:
        return ("host", r, certain)
    for p in waits:
        if p.peers is not None:  # a send or recv: it waits for its peer
            if not p.peers:
                return ("group", p.pg, False)
            found = _root(p.peers[0], by_group, pending, seen, certain and p.certain)
            if found[0] == "cycle" and not p.certain:
                continue
            return found
        f = by_group.get(p.pg)
        if f is None:
            return ("group", p.pg, certain)
        if f["kind"] in _SELF_CAUSED:
            return ("finding", id(f), certain)
        if f["kind"] == "no_records" and f["missing"]:
            return ("absent", f["missing"][0], certain)
        if f["kind"] == "device_stalled" and str(r) in f["stalled"]:
            return ("device", r, certain)
        held = [int(m) for m in (*f.get("stalled", {}), *f["missing"])] + [
            m for m in f["concerned"] if (q := (pending.get(m) or [None])[0]) and (q.pg, q.seq) != (f["group"], f["seq"])]
        held = [m for m in dict.fromkeys(held) if m != r]
        if not held:  # every member waits here and nowhere before: the collective itself
            return ("group", p.pg, certain)
        return _root(held[0], by_group, pending, seen, certain)
    return ("host", r, certain)


def _owner(cause: tuple, findings: list[dict], by_group: dict[str, dict], pending: dict[int, list[Pending]],
           when: dict[int, float], alone: frozenset = frozenset()) -> dict | None:
    """The finding that names a cause: `alone` are the ranks that wait on nothing (host, absent)."""
    kind, what, _certain = cause
    if kind == "finding":
        return next((f for f in findings if id(f) == what), None)
    if kind == "group":
        return by_group.get(what)
    if kind == "device":
        p = _first(pending.get(what))
        f = by_group.get(p.pg) if p else None
        if f is not None and str(what) in f.get("stalled", {}):
            return f
        return min((f for f in findings if str(what) in f.get("stalled", {})), key=lambda f: when[id(f)], default=None)
    # host, absent: a group whose missing ranks all wait on nothing (where others are missing too, its
    # absence is mixed with theirs, mostly consequences); whose waiting ranks wait there first (not
    # held before it elsewhere); naming most of them; where most ranks wait; then the first its peers
    # entered (a trimmed ring gives only a bound on when)
    def elsewhere(f: dict) -> int:
        return sum(1 for m in f["concerned"] if (p := (pending.get(m) or [None])[0]) and (p.pg, p.seq) != (f["group"],
                                                                                                         f["seq"]))
    return min((f for f in findings if what in f["missing"] and (kind == "host") == (f["kind"] != "no_records")),
               key=lambda f: (not alone.issuperset(f["missing"]), elsewhere(f), -len(alone.intersection(f["missing"])),
                              -len(f["concerned"]), when[id(f)]), default=None)


def rank_by_cause(findings: list[dict], pending: dict[int, list[Pending]], when: dict[int, float]) -> list[dict]:
    """The root findings, each with `consequences` (the findings blocked behind it, each with
    `blocked_by`: the root's group, op and sequence number, and `certain`), ordered by when the
    ranks parted."""
    by_group = {f["group"]: f for f in findings if f["kind"] not in ("rank_died",)}
    causes = {id(f): _causes_of(f, by_group, pending) for f in findings}
    alone = frozenset(c[1] for cs in causes.values() for c in cs if c[0] in ("host", "absent"))

    def owner(c: tuple) -> dict | None:
        return _owner(c, findings, by_group, pending, when, alone)

    roots, owner_of = [], {}
    for f in findings:
        owned = [c for c in causes[id(f)] if c[2] and owner(c) is f]
        if owned or not causes[id(f)]:
            roots.append(f)
            f["role"] = "root"
            f["cause"] = owned[0][0] if owned else "finding"
    for f in findings:
        if f.get("role") == "root":
            continue
        root, certain = next(((o, c[2]) for c in causes[id(f)] if (o := owner(c)) is not None
                              and o.get("role") == "root"), (None, True))
        if root is None:  # nothing reached a root (records too thin to follow): a root of its own
            roots.append(f)
            f["role"], f["cause"] = "root", "unknown"
            continue
        owner_of[id(f)] = root
        f["role"], f["certain"] = "consequence", certain
        f["blocked_by"] = {"group": root["group"], "ranks": root["ranks"], "op": root["op"], "seq": root["seq"],
                           "kind": root["kind"]}
    roots.sort(key=lambda f: when[id(f)])
    for r in roots:
        r["consequences"] = [f for f in findings if owner_of.get(id(f)) is r]
    return roots
