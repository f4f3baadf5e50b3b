"""Checkpoint verification is parallel: each rank checksums its own files, and the ranks agree."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from slurmtrain.common import checkpoint_format, events
from tests.conftest import run_gloo_ranks

FILES = {
    "mp_rank_00_model_states.pt": 3000,
    "zero_pp_rank_0_mp_rank_00_optim_states.pt": 5000,
    "zero_pp_rank_1_mp_rank_00_optim_states.pt": 5000,
    "rng_rank0.pt": 100,
    "rng_rank1.pt": 100,
}


def _checkpoint(root: Path, step: int) -> Path:
    tmp = root / f"step_{step}.tmp"
    tmp.mkdir(parents=True)
    for i, (name, size) in enumerate(FILES.items()):
        (tmp / name).write_bytes(bytes([(step + i) % 251]) * size)
    return checkpoint_format.publish(root, step, {"world_size": 2}, "checksum")


def test_each_rank_gets_its_own_files_and_together_they_cover_every_file_once():
    files = {name: {"size": size} for name, size in FILES.items()}
    shares = [checkpoint_format.files_for_rank(files, r, 2) for r in range(2)]
    assert sorted(shares[0] + shares[1]) == sorted(FILES)
    assert "zero_pp_rank_0_mp_rank_00_optim_states.pt" in shares[0] and "rng_rank0.pt" in shares[0]
    assert "zero_pp_rank_1_mp_rank_00_optim_states.pt" in shares[1] and "rng_rank1.pt" in shares[1]
    # a smaller world: the files of ranks no longer there are shared out, balanced by size
    four = {f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt": {"size": 100} for r in range(4)}
    one, other = (checkpoint_format.files_for_rank(four, r, 2) for r in range(2))
    assert len(one) == len(other) == 2 and not set(one) & set(other)
    # what a rank reads when it loads: its own partition and every shared file
    assert checkpoint_format.read_bytes(files, 1, 2) == 3000 + 5000 + 100


RANK = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    from types import SimpleNamespace

    import torch.distributed as dist

    from slurmtrain.common.schema import FaultsConfig
    from slurmtrain.common import checkpoint_format
    from slurmtrain.compute.checkpoint import verify
    from slurmtrain.compute.faults.watchdog import Watchdog

    root, out, rank = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    dist.init_process_group("gloo", rank=rank, world_size=2)
    read = []
    digest = checkpoint_format._digest
    def spy(path, kind=checkpoint_format.CHECKSUM, progress=None):
        read.append(f"{path.parent.name}/{path.name}")
        return digest(path, kind, progress)
    checkpoint_format._digest = spy
    records = []
    cfg = SimpleNamespace(faults=FaultsConfig(), checkpoint=SimpleNamespace(verify="checksum"),
                          resume="auto")
    run = SimpleNamespace(checkpoints=root, events=lambda: [])
    dog = Watchdog(600, out / "stacks", lambda why: None, 42)
    choice, limits = verify.choose(cfg, run, rank, 2, dog,
                                   lambda row: rank == 0 and records.append(row.to_json()))
    (out / f"rank{rank}.json").write_text(json.dumps({
        "path": str(choice.found.path), "skipped": choice.found.skipped, "read": read,
        "records": records, "phase": dog.current}))
    dist.destroy_process_group()
    """
)


def test_ranks_checksum_their_own_files_and_agree_to_skip_a_corrupt_one(tmp_path):
    root = tmp_path / "checkpoints"
    _checkpoint(root, 10)
    newest = _checkpoint(root, 20)
    shard = newest / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF  # flipped bytes, same size: only a checksum sees it
    shard.write_bytes(bytes(data))
    run_gloo_ranks(RANK, 2, str(root), str(tmp_path))
    zero, one = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    for rank in (zero, one):  # both ranks agree: step_20 is skipped, step_10 is the choice
        assert rank["path"] == str(root / "step_10")
        [(path, why)] = rank["skipped"]
        assert path == str(newest) and "checksum mismatch" in why and "(rank 1)" in why
    # rank 0 never read rank 1's partition; rank 1 read it (its own) and found it corrupt
    assert "step_20/zero_pp_rank_1_mp_rank_00_optim_states.pt" not in zero["read"]
    assert "step_20/zero_pp_rank_1_mp_rank_00_optim_states.pt" in one["read"]
    assert "step_10/rng_rank1.pt" in one["read"] and "step_10/rng_rank1.pt" not in zero["read"]
    # every file of the good checkpoint was checked exactly once, by one of the two ranks
    step10 = sorted(f for f in zero["read"] + one["read"] if f.startswith("step_10/"))
    assert step10 == sorted(f"step_10/{name}" for name in FILES)
    # the rows rank 0 recorded, read back as row objects
    rows = [events.parse(r) for r in zero["records"]]
    verified = [r for r in rows if isinstance(r, events.CheckpointVerified)]
    assert [v.ok for v in verified] == [False, True] and verified[1].files == len(FILES)
    assert isinstance(rows[0], events.Deadlines)
