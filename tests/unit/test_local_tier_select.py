"""The node-local tier's pure parts (issue 38): which step every node can load, from which copy,
a rank's files checksummed before use, and the local directory's layout and permissions."""

from __future__ import annotations

import stat
from pathlib import Path

from slurmtrain.common.checkpoint_format import seal
from slurmtrain.common.schema import CheckpointConfig
from slurmtrain.compute.checkpoint import buddy, local_tier
from slurmtrain.compute.checkpoint.local_resume import _View, rank_files_ok

FILES = (
    "mp_rank_00_model_states.pt",
    "zero_pp_rank_{r}_mp_rank_00_optim_states.pt",
    "rng_rank{r}.pt",
)


def _sealed(root: Path, step: int, ranks: list[int], world: int = 2) -> Path:
    tmp = root / f"step_{step}.tmp"
    for r in ranks:
        for name in FILES:
            path = tmp / name.format(r=r)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(f"{name} {r} {step}".encode() * 100)
    final = root / f"step_{step}"
    seal(tmp, final, {"step": step, "world_size": world}, "checksum")
    return final


def test_a_rank_loads_only_a_copy_whose_files_it_reads_match_the_manifest(tmp_path):
    d = _sealed(tmp_path, 4, ranks=[1])
    assert rank_files_ok(d, 1, 2) is None
    assert "rank 0's files are not in it" in str(rank_files_ok(d, 0, 2))
    assert "not 4" in str(rank_files_ok(d, 1, 4))  # another world size: the shared tier's job
    shard = d / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    shard.write_bytes(b"\0" * shard.stat().st_size)
    assert "checksum mismatch" in str(rank_files_ok(d, 1, 2))
    (d / "manifest.json").unlink()
    assert "manifest" in str(rank_files_ok(d, 1, 2))


def _view(seen: list[tuple[set[int], dict[int, str], set[int], dict[int, str]]]) -> _View:
    return _View(local_tier.Nodes([0, 1], 0), seen)


def test_the_newest_step_every_node_loads_from_its_own_copy_or_its_buddys():
    # node 1 lost step 6 locally; node 0 holds node 1's buddy copy of 6; node 1 holds node 0's
    view = _view([({4, 6}, {}, {4, 6}, {}), ({4}, {6: "missing file x"}, {4, 6}, {})])
    assert view.best() == 6
    assert view.own(1) == {4} and view.own_why(1, 6) == "missing file x"
    # and without node 0's buddy copy of 6 (corrupt), step 4: what both nodes hold
    view = _view([({4, 6}, {}, {4}, {6: "x: checksum mismatch (corrupt)"}), ({4}, {}, {4, 6}, {})])
    assert view.best() == 4
    assert "node 1 cannot load step_6" in view.passed_over(4)
    assert "checksum mismatch" in view.passed_over(4)
    assert view.passed_over(8) == "no local step newer than the shared tier's step_8"


def test_one_node_has_no_buddy_and_its_ranks_agree_on_one_step():
    view = _View(
        local_tier.Nodes([0, 0], 1), [({2, 4}, {}, set(), {}), ({2}, {4: "bad"}, set(), {})]
    )
    assert view.where.count == 1 and view.best() == 2
    assert view.held_why(0, 4) == "no buddy on one node"


def test_local_dir_is_per_node_private_and_a_received_copy_appears_whole(tmp_path):
    cfg = CheckpointConfig(local_every_steps=2, local_dir=str(tmp_path / "n{node}"))
    root = local_tier.local_root(cfg, tmp_path / "runs" / "abc", 1)
    assert root.parent == tmp_path / "n1" and root.name.startswith("abc-")
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    src = _sealed(tmp_path / "src", 2, ranks=[0, 1])
    buddy.write_tree(buddy.read_tree(src), root / "buddy" / "0" / "step_2")
    assert rank_files_ok(root / "buddy" / "0" / "step_2", 1, 2) is None
    assert not list((root / "buddy" / "0").glob("*.tmp"))
