"""N-D process groups: which ranks form each TP, CP and EP group.

Rank layout is row-major over (ep, cp, tp), TP innermost: TP peers are adjacent ranks, so on
a multi-GPU host they share the fastest links (TP has the most traffic: two allreduces per
layer), CP next, EP outermost. For world 4 = TP2 x CP2: TP groups {0,1} {2,3}, CP groups
{0,2} {1,3}.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

AXES = ("ep", "cp", "tp")  # outermost to innermost


@dataclass(frozen=True)
class Mesh:
    tp: int = 1
    cp: int = 1
    ep: int = 1

    def __post_init__(self):
        for axis in AXES:
            if getattr(self, axis) < 1:
                raise ValueError(f"--{axis} must be >= 1, got {getattr(self, axis)}")

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.ep

    def coords(self, rank: int) -> dict[str, int]:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside a world of {self.world_size}")
        out = {}
        for axis in reversed(AXES):
            size = getattr(self, axis)
            out[axis] = rank % size
            rank //= size
        return {a: out[a] for a in ("tp", "cp", "ep")}

    def rank_of(self, coords: dict[str, int]) -> int:
        r = 0
        for axis in AXES:
            r = r * getattr(self, axis) + coords[axis]
        return r

    def group_ranks(self, axis: str, rank: int) -> list[int]:
        """The ranks of `rank`'s group along `axis`, in group-rank order."""
        c = self.coords(rank)
        return [self.rank_of({**c, axis: i}) for i in range(getattr(self, axis))]

    def all_groups(self, axis: str) -> list[list[int]]:
        """Every group along `axis`, in a fixed order (torch.distributed.new_group needs all ranks to agree)."""
        seen: list[list[int]] = []
        for r in range(self.world_size):
            g = self.group_ranks(axis, r)
            if g not in seen:
                seen.append(g)
        return seen

    def layout(self) -> list[dict]:
        """Per rank: its coordinates and groups (for the manifest and the printed mapping)."""
        return [{"rank": r, **self.coords(r), **{f"{a}_group": self.group_ranks(a, r) for a in ("tp", "cp", "ep")}}
                for r in range(self.world_size)]

    def describe(self) -> str:
        dims = " x ".join(f"{a.upper()}{getattr(self, a)}" for a in ("tp", "cp", "ep") if getattr(self, a) > 1) or "1 rank"
        lines = [f"world {self.world_size} = {dims}"]
        for row in self.layout():
            groups = ", ".join(f"{a} group {row[f'{a}_group']}" for a in ("tp", "cp", "ep") if getattr(self, a) > 1)
            lines.append(f"  rank {row['rank']}: tp {row['tp']} cp {row['cp']} ep {row['ep']}" + (f" ({groups})" if groups else ""))
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return asdict(self)


def build_comms(mesh: Mesh, backend: str, **options) -> dict:
    """One `Comm` per axis of size > 1 for this rank; every rank must call this together."""
    import torch.distributed as dist

    from .backends import make_comm

    rank = dist.get_rank()
    if dist.get_world_size() != mesh.world_size:
        raise ValueError(f"the mesh needs {mesh.world_size} ranks, the job has {dist.get_world_size()}")
    comms = {}
    for axis in ("tp", "cp", "ep"):
        if getattr(mesh, axis) == 1:
            continue
        mine = None
        for g in mesh.all_groups(axis):
            pg = None if len(g) == mesh.world_size else dist.new_group(g)
            if rank in g:
                mine = (pg, g)
        comms[axis] = make_comm(backend, axis, group=mine[0], ranks=mine[1], **options)
    return comms
