"""Which rank each trace of a set is, decided over the whole set at once from the evidence every
reader records (`Trace.extra["identity"]`, readers/model.py `evidence`). One trace alone cannot
tell whether its device index repeats on another node (a multi-node Nsight collection: one export
per process, CUDA devices 0-2 on every node), so the rule is chosen here, after the map.

Rules, best evidence first; the first that names every trace, with no two alike, is taken and named
in the result (`ranks[].rank_rule`, `source.rank_rule`):

1. `--rank-from REGEX` on the file name (its first group, plus the part's place in a file): the user
   said so;
2. the trace's own rank (Kineto `distributedInfo`, an Nsight thread named "... rank N", a rocpd
   process's RANK variable): authoritative, so two traces that claim one rank are refused, naming
   both files (one process profiled twice, or two jobs in one directory);
3. a rank in the file name (`rank3`, an engine's `..._rank3` coordinates);
4. (host, device): hosts in name order, devices in index order; on one host the device index is
   the rank (torchrun's local rank is the device);
5. (host, pid): hosts in name order, processes in pid order;
6. the order of first work in file order: only where nothing above tells, and said so.

Two traces of one process of one job (same host, pid and device) are the one case refused.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

from ..readers.model import TraceError, ascii_number

OWN, NAME, RANK_FROM = "the trace's own rank", "the file name", "--rank-from"
HOST_DEVICE, HOST_PID, ORDER = "(host, device)", "(host, pid)", "the order of first work"
HINT = "--rank-from REGEX names ranks from the file names"


def compile_rank_from(pattern: str | None) -> re.Pattern | None:
    """--rank-from, compiled and checked once, up front: a bad pattern is one line, not an error
    inside a worker."""
    if not pattern:
        return None
    try:
        with warnings.catch_warnings():  # a FutureWarning of re's would be a second line on stderr
            warnings.simplefilter("ignore")
            rx = re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        raise TraceError(f"--rank-from {pattern[:80]!r} is not a regular expression ({e})") from None
    if rx.groups < 1:
        raise TraceError(f"--rank-from {pattern[:80]!r} has no group: its first group must capture the rank number")
    return rx


@dataclass
class Assignment:
    ranks: list[int]
    rule: str
    notes: list[str]


def _distinct(values: list) -> bool:
    return None not in values and len(set(values)) == len(values)


def _duplicate(values: list, files: list[str]) -> tuple[str, str] | None:
    seen: dict = {}
    for v, f in zip(values, files):
        if v is None:
            continue
        if v in seen:
            return seen[v], f
        seen[v] = f
    return None


def assign(evs: list[dict], rank_from: str | None = None) -> Assignment:
    """One rank per trace (evidence dicts in map order) by the first rule that tells them all apart."""
    files = [e.get("label") or e["file"] for e in evs]
    n = len(evs)
    rx = compile_rank_from(rank_from)
    if rx is not None:
        ranks = []
        for e, f in zip(evs, files):
            m = rx.search(e["file"])
            number = ascii_number(m.group(1)) if m else None
            if number is None:
                got = f" (it captured {m.group(1)[:40]!r})" if m and m.group(1) else ""
                raise TraceError(f"{f}: --rank-from {rank_from[:80]!r} does not match the file name with a number in "
                                 f"ASCII digits as its first group{got}")
            ranks.append(number + e.get("part", 0))
        _refuse_twice(ranks, files, RANK_FROM, "the pattern gives two files one rank")
        return Assignment(ranks, RANK_FROM, [])
    own = [e.get("own") for e in evs]
    # a process's own rank names the process: where it drove several devices, its parts share it and
    # it tells them apart no more than the process id does (the next rules do)
    parts_of = {(e["file"], e.get("pid"), e.get("part")) for e in evs}
    shared_by_parts = len({(e["file"], e.get("pid"), o) for e, o in zip(evs, own)}) < len(parts_of)
    if None not in own and not shared_by_parts:
        _refuse_twice(own, files, OWN, "one process profiled twice, or two jobs in one directory: analyze them apart")
        return Assignment(own, OWN, [])
    named = [e.get("name_rank") for e in evs]
    if _distinct(named):
        return Assignment(named, NAME, [])
    hosts = [e.get("host") or "" for e in evs]
    devices = [e.get("device") for e in evs]
    if None not in devices and _distinct(list(zip(hosts, devices))):
        return Assignment(_by_host(hosts, devices), HOST_DEVICE, _guess_note(evs, HOST_DEVICE, hosts))
    pids = [e.get("pid") for e in evs]
    # a process's parts (one per device it drove) differ by device, else by their place in its file;
    # two files of one process repeat both
    within = [d if d is not None else ("part", e.get("part", 0)) for d, e in zip(devices, evs)]
    if None not in pids and _distinct(list(zip(hosts, pids, within))):
        order = sorted(range(n), key=lambda i: (hosts[i], pids[i], evs[i].get("part", 0)))
        return Assignment(_positions(order), HOST_PID, _guess_note(evs, HOST_PID, hosts))
    same = _duplicate([(h, p, w) if p is not None else None for h, p, w in zip(hosts, pids, within)], files)
    if same:
        raise TraceError(f"two traces of one process ({same[0]} and {same[1]}): one process profiled twice; analyze "
                         f"them apart ({HINT})")
    return Assignment(list(range(n)), ORDER, _guess_note(evs, ORDER, hosts))


def _refuse_twice(ranks: list[int], files: list[str], rule: str, why: str) -> None:
    dup = _duplicate(ranks, files)
    if dup:
        r = ranks[files.index(dup[0])]
        raise TraceError(f"rank {r} appears in two files ({dup[0]} and {dup[1]}; by {rule}): {why} ({HINT})")


def _by_host(hosts: list[str], devices: list[int]) -> list[int]:
    """Ranks from (host, device): on one host the device index itself; on several, hosts in name
    order, each host's devices in index order, numbered as torchrun numbers a job (node_rank *
    nproc_per_node + local_rank) where every host has the same devices, consecutively where not."""
    names = sorted(set(hosts))
    if len(names) == 1:
        return list(devices)
    per_host = {h: sorted(d for hh, d in zip(hosts, devices) if hh == h) for h in names}
    same = all(v == per_host[names[0]] for v in per_host.values())
    if same:
        k = len(per_host[names[0]])
        return [names.index(h) * k + per_host[h].index(d) for h, d in zip(hosts, devices)]
    order = sorted(range(len(hosts)), key=lambda i: (hosts[i], devices[i]))
    return _positions(order)


def _positions(order: list[int]) -> list[int]:
    ranks = [0] * len(order)
    for pos, i in enumerate(order):
        ranks[i] = pos
    return ranks


def _guess_note(evs: list[dict], rule: str, hosts: list[str]) -> list[str]:
    """The note a guessed rule leaves (none for one trace: its number names nothing else)."""
    if len(evs) < 2:
        return []
    where = f" on {len(set(hosts))} hosts" if len(set(h for h in hosts if h)) > 1 else ""
    return [f"no rank recorded in {len(evs)} traces{where}; ranks from {rule} ({HINT})"]
