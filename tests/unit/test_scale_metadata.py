"""No metadata storms: watching a universal conversion and learning that an async
save's ranks are done cost the shared filesystem O(hosts) calls per poll and O(hosts) marker
files per save, whatever the ranks per host. Simulated worlds: threads running the real watchers
and the real Checkpointer background code, the shared filesystem's calls counted at the `os`
level (every call whose path lies under the simulated shared root)."""

from __future__ import annotations

import builtins
import contextlib
import inspect
import io
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from slurmtrain.common import checkpoint_format
from slurmtrain.common.events import CheckpointFailed, CheckpointSaved
from slurmtrain.common.schema import CheckpointConfig
from slurmtrain.compute.checkpoint import manager, reshape
from slurmtrain.compute.context import RankContext
from slurmtrain.compute.distributed import Placement
from slurmtrain.compute.faults.watchdog import Watchdog

EVERY = 0.0123  # the watchers' poll period in these tests: their waits are counted, not timed
POLLS = 3
CALLS = ("scandir", "listdir", "stat", "lstat", "open", "replace", "rename", "unlink", "mkdir")


class Counter:
    """Counts the `os` (and `open`) calls made on paths under `root`, from any thread."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
        self.root, self.calls, self.on = str(root), [], True
        for name in CALLS:
            monkeypatch.setattr(os, name, self._wrap(name, getattr(os, name)))
        opener = self._wrap("open", builtins.open)
        monkeypatch.setattr(builtins, "open", opener)
        monkeypatch.setattr(io, "open", opener)

    def _wrap(self, name: str, real: Any) -> Any:
        def counted(path: Any = ".", *args: Any, **kwargs: Any) -> Any:
            if self.on and isinstance(path, (str, os.PathLike)):
                if os.fspath(path).startswith(self.root):
                    self.calls.append((name, os.fspath(path)))
            return real(path, *args, **kwargs)

        return counted

    def take(self) -> int:
        n, self.calls = len(self.calls), []
        return n


def _leads(hosts: int, per_host: int) -> list[int]:
    return [r - r % per_host for r in range(hosts * per_host)]


# ---- conversion progress --------------------------------------------------------------------------
class _Polls(threading.Event):
    """A watcher's stop event: POLLS polls at once, then it waits for the stop like a real one."""

    done = threading.Semaphore(0)

    def wait(self, timeout: Any = None) -> bool:
        if timeout != EVERY:
            return super().wait(timeout)
        self.polls = getattr(self, "polls", 0) + 1
        if self.polls <= POLLS:
            return False
        type(self).done.release()
        return super().wait()


def _conversion_polls(tmp_path: Path, counter: Counter, hosts: int, per_host: int) -> float:
    """Shared-FS calls per poll of every rank's conversion watcher together."""
    folder = tmp_path / "shared" / "checkpoints" / "step_40_universal.tmp"
    for n in range(12):  # a conversion under way: parameter folders with their states
        (folder / "zero" / f"p{n}").mkdir(parents=True, exist_ok=True)
        (folder / "zero" / f"p{n}" / "fp32.pt").write_bytes(b"\0" * 64)
    roles = "role" in inspect.signature(reshape.growing).parameters  # today: every rank walks
    leads = _leads(hosts, per_host)
    counter.take()
    with contextlib.ExitStack() as stack:
        for rank, lead in enumerate(leads):
            how: dict[str, Any] = {}
            if roles:
                role = "walk" if rank == 0 else "relay" if rank == lead else "follow"
                how = {"role": role, "note": tmp_path / "shm" / f"host{lead}.progress"}
            stack.enter_context(reshape.growing(folder, lambda n: None, every_s=EVERY, **how))
        for _ in leads:
            assert _Polls.done.acquire(timeout=60)
        calls = counter.take()
    return calls / POLLS


@pytest.fixture
def polls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Counter:
    (tmp_path / "shm").mkdir()
    monkeypatch.setattr(reshape.threading, "Event", _Polls)
    return Counter(monkeypatch, tmp_path / "shared")


def test_conversion_watchers_cost_the_shared_filesystem_per_host_not_per_rank(tmp_path, polls):
    one_per_host = _conversion_polls(tmp_path, polls, hosts=8, per_host=1)
    eight_per_host = _conversion_polls(tmp_path, polls, hosts=8, per_host=8)
    checkpoint_format.dir_bytes(tmp_path / "shared" / "checkpoints" / "step_40_universal.tmp")
    walk = polls.take()  # one look at the folder
    assert eight_per_host == one_per_host, (one_per_host, eight_per_host)
    assert eight_per_host <= walk + 8, (walk, eight_per_host)  # + a read of the note per host


# ---- async save completion ------------------------------------------------------------------------
class _Writer:
    """A rank's shard writer after its shards are on disk: one shard, its report."""

    def __init__(self, tmp: Path, rank: int, error: Any = None) -> None:
        self.tmp, self.rank, self.error = tmp, rank, error

    def flush(self) -> None:
        self.tmp.mkdir(parents=True, exist_ok=True)
        (self.tmp / f"shard_rank{self.rank}.pt").write_bytes(b"s" * (self.rank + 1))

    def report(self, rank: int) -> dict[str, Any]:
        files = {} if self.error else {f"shard_rank{rank}.pt": {"size": rank + 1}}
        return {"rank": rank, "ok": not self.error, "error": self.error, "files": files}

    def discard(self) -> None:
        pass


def _world(root: Path, hosts: int, per_host: int) -> list[manager.Checkpointer]:
    leads, events = _leads(hosts, per_host), []
    ranks = []
    for rank in range(len(leads)):
        where = Placement(rank, 0, len(leads), "localhost", 29500, None, f"n{leads[rank]}")
        watchdog = Watchdog(60.0, root / "stacks.txt", lambda why: None, 1)
        ctx = RankContext(where, "cpu", lambda row: None, watchdog)
        cfg = CheckpointConfig(verify="size", async_save=True, publish_timeout_minutes=0.5 / 60)
        c = manager.Checkpointer(cfg, ctx, root)
        c.record = events.append
        c.events, c.leads = events, leads
        c.writer = _Writer(root / "step_10.tmp", rank)
        ranks.append(c)
    return ranks


def _save(ranks: list[manager.Checkpointer], silent: tuple[int, ...] = ()) -> None:
    """Every rank's background thread; rank 0's last (it waits for the others' lines)."""
    job = manager._Save(10, {"world_size": len(ranks)}, time.time(), 0.0)
    for c in ranks[1:]:
        if c.rank in silent:
            c.writer.flush()  # wrote its shard, then died before saying so
        else:
            c._background(job)
    ranks[0]._background(job)


def test_an_async_save_makes_one_marker_per_host_and_polls_per_host(tmp_path, monkeypatch):
    counter = Counter(monkeypatch, tmp_path)
    counter.on = False
    ranks = _world(tmp_path, hosts=8, per_host=8)
    job = manager._Save(10, {"world_size": 64}, time.time(), 0.0)
    for c in ranks[1:]:
        c._background(job)
    tmp = tmp_path / "step_10.tmp"
    marker_files = [p.name for p in tmp.iterdir() if p.name.startswith(".")]
    counter.on = True
    reports = ranks[0]._collect(tmp)
    per_poll = counter.take()
    assert len(marker_files) <= 8, marker_files  # one per host, not one per rank
    assert per_poll <= 8 + 1, per_poll  # a read per host and one listing of the root
    assert [r["rank"] for r in reports] == list(range(1, 64)) and all(r["ok"] for r in reports)


def test_the_save_is_published_with_every_ranks_shard_and_no_marker(tmp_path):
    ranks = _world(tmp_path, hosts=4, per_host=4)
    _save(ranks)
    assert ranks[0]._outcome.ok, ranks[0]._outcome
    final = tmp_path / "step_10"
    files = json.loads((final / "manifest.json").read_text())["files"]
    assert sorted(files) == sorted(f"shard_rank{r}.pt" for r in range(16))
    assert not [p for p in final.iterdir() if p.name.startswith(".")]
    assert [type(row) for row in ranks[0].events] == [CheckpointSaved]


def test_a_failed_rank_is_named_and_nothing_is_published(tmp_path):
    ranks = _world(tmp_path, hosts=4, per_host=4)
    ranks[6].writer.error = "writing shard_rank6.pt: OSError: [Errno 28] No space left"
    _save(ranks)
    outcome = ranks[0]._outcome
    assert not outcome.ok and "rank 6: writing shard_rank6.pt" in outcome.error
    assert not (tmp_path / "step_10").exists() and not (tmp_path / "step_10.tmp").exists()
    assert [type(row) for row in ranks[0].events] == [CheckpointFailed]


def test_a_rank_that_never_reports_fails_the_save_after_the_wait(tmp_path):
    ranks = _world(tmp_path, hosts=4, per_host=4)
    _save(ranks, silent=(9,))
    outcome = ranks[0]._outcome
    assert not outcome.ok and "rank 9: no marker" in outcome.error
    assert not (tmp_path / "step_10").exists()


def test_a_rank_that_cannot_append_its_line_is_reported_failed(tmp_path, monkeypatch):
    ranks = _world(tmp_path, hosts=2, per_host=4)
    real = os.write

    def full(fd: int, data: bytes) -> int:  # a full disk: the line is cut short
        if b'"rank": 5' in data:
            return real(fd, data[:7])
        return real(fd, data)

    monkeypatch.setattr(os, "write", full)
    _save(ranks)
    outcome = ranks[0]._outcome
    assert not outcome.ok and "rank 5: could not write into the directory" in outcome.error
    assert "rank 4" not in outcome.error and "rank 6" not in outcome.error  # same host, unspoilt


def test_a_hosts_ranks_appending_at_once_never_spoil_each_others_lines(tmp_path):
    from slurmtrain.compute.checkpoint import markers

    tmp = tmp_path / "step_3.tmp"
    tmp.mkdir()
    files = {f"zero_pp_rank_{n}_optim_states.pt": {"size": n, "crc32": "0" * 8} for n in range(50)}
    go = threading.Barrier(8)

    def rank(r: int) -> None:
        go.wait()
        for _ in range(20):  # many appends racing, each one whole line
            markers.write(tmp, {"rank": r, "ok": True, "error": None, "files": files}, lead=0)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = markers.lines(markers.marker(tmp, 0))
    assert len(lines) == 160 and all(line["files"] == files for line in lines)


# ---- the collective around the conversion ---------------------------------------------------------
class _Group:
    """A process group of threads: each collective checks every rank called the same one."""

    def __init__(self, hosts: list[str]) -> None:
        self.hosts, self.me = hosts, threading.local()
        self.sync, self.slots = threading.Barrier(len(hosts), timeout=30), [None] * len(hosts)

    def _meet(self, op: str, obj: Any) -> list[Any]:
        self.slots[self.me.rank] = (op, obj)
        self.sync.wait()
        seen = list(self.slots)
        self.sync.wait()
        assert {s[0] for s in seen} == {op}, f"ranks called different collectives: {seen}"
        return [s[1] for s in seen]

    def all_gather_object(self, out: list[Any], obj: Any) -> None:
        out[:] = self._meet("all_gather_object", obj)

    def broadcast_object_list(self, box: list[Any], src: int = 0) -> None:
        box[:] = [self._meet("broadcast_object_list", box[0])[src]]

    def get_world_size(self) -> int:
        return len(self.hosts)


def test_every_rank_takes_part_in_the_conversions_collectives_and_one_walks(tmp_path, monkeypatch):
    dist = pytest.importorskip("torch.distributed")
    from slurmtrain.compute import distributed

    group = _Group(["a", "a", "b", "b"])
    for name in ("all_gather_object", "broadcast_object_list", "get_world_size"):
        monkeypatch.setattr(dist, name, getattr(group, name))
    monkeypatch.setattr(distributed.socket, "gethostname", lambda: group.hosts[group.me.rank])
    step = tmp_path / "step_20"
    step.mkdir()

    def convert(path: Path, source: Any, verify: str) -> reshape.Converted:
        return reshape.Converted(reshape.universal_dir(path), 1.0, False)

    roles: dict[int, str] = {}
    real = reshape.growing

    def growing(folder: Path, beat: Any, every_s: float = 10.0, role: str = "walk", **kw: Any):
        roles[group.me.rank] = role
        return real(folder, beat, every_s, role, **kw)

    monkeypatch.setattr(reshape, "convert", convert)
    monkeypatch.setattr(reshape, "growing", growing)
    found, paths = checkpoint_format.Resume(step, {"world_size": 1, "step": 20}), {}

    def rank(r: int) -> None:
        group.me.rank = r
        paths[r] = reshape.for_world(found, r, 4, lambda row: None, beat=lambda n: None)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert set(paths.values()) == {tmp_path / "step_20_universal"} and len(paths) == 4
    assert roles == {0: "walk", 1: "follow", 2: "relay", 3: "follow"}
