"""Which copy an attempt resumes from: own local copy, then the buddy's copy, then the shared tier.

Every rank checksums its own files (its ZeRO partition, its RNG state, the shared model states) in
its node's local steps; every node lead fully checksums the buddy copies it holds for the previous
node. One all_gather, and every rank computes the same answer: the newest step every node can load
from its own copy or its buddy's, unless the shared tier's (already verified) step is newer. A node
that takes its step from its buddy gets the files back through the process group, and its ranks
checksum them again before anything loads. Each rank records a `resume_source` row (tier, reason).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from slurmtrain.common import events
from slurmtrain.common.checkpoint_format import (
    OWNER,
    Resume,
    read_manifest,
    step_dirs,
    tag,
    validate,
    verify_files,
)
from slurmtrain.common.schema import CheckpointConfig
from slurmtrain.compute.checkpoint import buddy, local_tier
from slurmtrain.compute.context import Record

LOCAL, BUDDY, SHARED = "local", "buddy", "shared"  # the tiers a `resume_source` row names
Why = dict[int, str]  # step -> why it cannot be loaded


def rank_files_ok(directory: Path, rank: int, world: int) -> Optional[str]:
    """None when every file rank `rank` reads from `directory` is there and matches its checksum."""
    try:
        manifest = read_manifest(directory)
    except (OSError, ValueError) as err:
        return f"unreadable manifest: {err}"
    if int(manifest.get("world_size", -1)) != world:
        return f"saved by {manifest.get('world_size')} ranks, not {world}"
    files = manifest.get("files") or {}
    if f"rng_rank{rank}.pt" not in files:
        return f"rank {rank}'s files are not in it"
    names = [n for n in files if (m := OWNER.search(n)) is None or int(m[1] or m[2]) == rank]
    return verify_files(directory, names)


def _scan(root: Path, check: object) -> tuple[set[int], Why]:
    ok, why = set(), {}
    for d in step_dirs(root) if root.is_dir() else []:
        step = int(d.name.split("_")[1])
        reason = check(d) if callable(check) else None
        if reason is None:
            ok.add(step)
        else:
            why[step] = str(reason)
    return ok, why


@dataclass
class _View:
    """What every rank reported: (own steps ok, why not, held buddy steps ok, why not)."""

    where: local_tier.Nodes
    seen: list[tuple[set[int], Why, set[int], Why]]

    def _keeper(self, j: int) -> int:
        return self.where.order[(j + 1) % self.where.count]

    def own(self, j: int) -> set[int]:
        return set.intersection(*(self.seen[r][0] for r in self.where.ranks(j)))

    def held(self, j: int) -> set[int]:
        return self.seen[self._keeper(j)][2] if self.where.count > 1 else set()

    def own_why(self, j: int, step: int) -> str:
        whys = [self.seen[r][1].get(step) for r in self.where.ranks(j)]
        return next((w for w in whys if w), f"no local copy of {tag(step)}")

    def held_why(self, j: int, step: int) -> str:
        if self.where.count < 2:
            return "no buddy on one node"
        return self.seen[self._keeper(j)][3].get(step, f"no buddy copy of {tag(step)}")

    def best(self) -> int:
        nodes = range(self.where.count)
        return max(set.intersection(*(self.own(j) | self.held(j) for j in nodes)), default=-1)

    def anything(self) -> bool:
        return any(s[0] or s[1] or s[2] or s[3] for s in self.seen)

    def passed_over(self, shared_step: int) -> str:
        """Why the shared tier: the first node that cannot load the newest local step."""
        steps = {s for r in self.seen for s in (*r[0], *r[1], *r[2], *r[3])}
        top = max((s for s in steps if s > shared_step), default=None)
        if top is None:
            return f"no local step newer than the shared tier's {tag(max(shared_step, 0))}"
        for j in range(self.where.count):
            if top not in self.own(j) | self.held(j):
                return (
                    f"node {j} cannot load {tag(top)}: local: {self.own_why(j, top)}; "
                    f"buddy: {self.held_why(j, top)}"
                )
        return f"{tag(top)} is not held by every node"


def choose(
    cfg: CheckpointConfig,
    run_path: Path,
    rank: int,
    world: int,
    shared: Resume,
    record: Record,
    discard: bool = False,
) -> Resume:
    """Collective. `shared`: the shared tier's verified choice. `discard` (resume=none|step_N
    applied): the local copies are removed, never loaded."""
    import torch.distributed as dist

    where = local_tier.nodes(rank, world)
    root = local_tier.local_root(cfg, run_path, where.node)
    if discard:
        if where.is_lead:
            local_tier.forget(root)
        dist.barrier()
        return shared
    own_ok, own_why = _scan(root / local_tier.OWN, lambda d: rank_files_ok(d, rank, world))
    held: tuple[set[int], Why] = (set(), {})
    if where.is_lead and where.count > 1:
        prev = (where.node - 1) % where.count
        held = _scan(root / local_tier.BUDDY / str(prev), lambda d: validate(d, True))
    seen: list[tuple[set[int], Why, set[int], Why]] = [(set(), {}, set(), {})] * world
    dist.all_gather_object(seen, (own_ok, own_why, *held))
    view = _View(where, seen)
    best = view.best()
    shared_step = int(shared.manifest.get("step", 0)) if shared.path is not None else -1
    if best < 0 and shared.path is None and not view.anything():
        return shared  # nothing saved anywhere yet: a first start
    if best < 0 or best < shared_step:
        _note(record, shared_step, SHARED, view.passed_over(shared_step))
        return shared
    lacking = [j for j in range(where.count) if best not in view.own(j)]
    _restore(where, root, best, lacking)
    final = root / local_tier.OWN / tag(best)
    late = rank_files_ok(final, rank, world) if best not in own_ok else None
    lates: list[Optional[str]] = [None] * world
    dist.all_gather_object(lates, late)
    if any(lates):
        reason = f"buddy copy of {tag(best)} failed its checksum after the transfer: "
        _note(record, shared_step, SHARED, reason + str(next(x for x in lates if x)))
        return shared
    if len(lacking) < where.count:
        _note(record, best, LOCAL, None)
    for j in lacking:
        _note(record, best, BUDDY, f"node {j}: {view.own_why(j, best)}", where.order[j])
    return Resume(final, read_manifest(final))


def _restore(where: local_tier.Nodes, root: Path, step: int, lacking: list[int]) -> None:
    """Each node in `lacking` gets `step` from its buddy (the next node's lead) into `own/`."""
    import torch.distributed as dist

    for j in lacking:
        lead, keeper = where.order[j], where.order[(j + 1) % where.count]
        if where.rank == keeper:
            held = root / local_tier.BUDDY / str(j) / tag(step)
            buddy.send(buddy.read_tree(held), lead)
        elif where.rank == lead:
            got = buddy.recv(keeper)
            assert isinstance(got, dict)
            buddy.write_tree(got, root / local_tier.OWN / tag(step))
    dist.barrier()


def _note(
    record: Record, step: int, tier: str, reason: Optional[str], rank: Optional[int] = None
) -> None:
    """Rank 0 records (Attempt.record); it prints each fallback once."""
    import torch.distributed as dist

    record(events.ResumeSource(step=max(step, 0), tier=tier, reason=reason, rank=rank))
    if reason is not None and dist.get_rank() == 0:
        print(f"slurmtrain: resuming from the {tier} tier: {reason}", file=sys.stderr, flush=True)
