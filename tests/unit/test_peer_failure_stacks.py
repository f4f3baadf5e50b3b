"""A rank whose collective fails because a peer hung (and exited first) still leaves its stacks."""

from __future__ import annotations

from slurmtrain.compute.faults.watchdog import Watchdog


def test_a_peer_failure_writes_this_ranks_stacks_once_and_never_over_its_own_dump(tmp_path):
    stacks = tmp_path / "hangs" / "attempt1.rank0.txt"
    dog = Watchdog(15.0, stacks, lambda why: None, 5)
    dog.dump_after_peer_failure("peer failure: RuntimeError: Connection closed by peer\n")
    text = stacks.read_text()
    assert text.startswith("peer failure: RuntimeError") and "Thread" in text
    stacks.write_text("no progress for 18 s after step 8\n")  # its own watchdog wrote first
    dog.dump_after_peer_failure("peer failure: again\n")
    assert stacks.read_text() == "no progress for 18 s after step 8\n"
