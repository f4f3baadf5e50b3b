"""A rank whose collective fails because a peer hung (and exited first) still leaves its stacks."""

from __future__ import annotations

from slurmtrain.compute.faults.watchdog import Watchdog


def test_a_peer_failure_writes_this_ranks_stacks_once_and_never_over_its_own_dump(tmp_path):
    stacks = tmp_path / "hangs" / "attempt1.rank0.txt"
    dog = Watchdog(15.0, stacks, lambda why: None, 5)
    dog.dump_after_peer_failure("peer failure: RuntimeError: Connection closed by peer\n")
    text = stacks.read_text()
    assert text.startswith("peer failure: RuntimeError") and "Thread" in text
    dog.dump_after_peer_failure("peer failure: again\n")  # written once per process
    assert stacks.read_text() == text


def test_the_ranks_of_a_node_append_their_stacks_to_one_file(tmp_path):
    # An all-rank hang of 64 x 8 ranks makes 64 files, not 512: one block per rank.
    stacks = tmp_path / "hangs" / "attempt1.node7.txt"
    for rank in (8, 9, 15):
        dog = Watchdog(15.0, stacks, lambda why: None, 5, rank=rank)
        dog.dump_after_peer_failure(f"peer failure seen by {rank}\n")
        dog.dump_after_peer_failure("again\n")  # its own dump is never repeated
    text = stacks.read_text()
    assert [ln for ln in text.splitlines() if ln.startswith("====")] == [
        "==== rank 8 ====",
        "==== rank 9 ====",
        "==== rank 15 ====",
    ]
    assert "peer failure seen by 9" in text and "again" not in text
    assert sorted(p.name for p in (tmp_path / "hangs").iterdir()) == ["attempt1.node7.txt"]
