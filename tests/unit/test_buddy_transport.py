"""The buddy copy's transport (compute/checkpoint/buddy.py) between real gloo processes: a node's
files, an empty one and one over several pieces included, arrive byte for byte around a ring of
two and of three node leads, and `write_tree` seals them under the final name; a send of only
empty files, or of none, arrives as such (the local-tier drill's crash: a tensor over no bytes)."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.conftest import run_gloo_ranks

RANK = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path

    import torch.distributed as dist

    from slurmtrain.compute.checkpoint import buddy

    out, world, rank = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    buddy.CHUNK = 1000  # several pieces a file, the last one short
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mine = out / f"own{rank}"
    (mine / "sub").mkdir(parents=True)
    (mine / "sub" / "big.pt").write_bytes(bytes((rank * 7 + i) % 251 for i in range(4321)))
    (mine / "empty").write_bytes(b"")
    (mine / "r\u00e9sum\u00e9.json").write_text(json.dumps({"rank": rank}))
    got = buddy.ring(rank, world, list(range(world)), buddy.read_tree(mine))
    buddy.write_tree(got, out / f"held{rank}" / "step_5")
    # nothing but empty files, then no file at all (rank 0 to rank 1, as _share and _restore)
    for files in ({"a": b"", "b": b""}, {}):
        if rank == 0:
            buddy.send(files, 1)
        elif rank == 1:
            assert {k: bytes(v) for k, v in buddy.recv(0).items()} == files
    dist.destroy_process_group()
    """
)


def _digests(directory) -> dict[str, str]:
    import hashlib

    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("world", [2, 3])
def test_a_ring_of_leads_delivers_every_file_byte_for_byte(tmp_path, world):
    run_gloo_ranks(RANK, world, str(tmp_path), str(world), timeout=120)
    for rank in range(world):
        prev = (rank - 1) % world
        held = tmp_path / f"held{rank}" / "step_5"
        assert _digests(held) == _digests(tmp_path / f"own{prev}")  # the previous node's copy
        assert json.loads((held / "r\u00e9sum\u00e9.json").read_text()) == {"rank": prev}
        assert (held / "empty").stat().st_size == 0
        assert not (tmp_path / f"held{rank}" / "step_5.tmp").exists()
