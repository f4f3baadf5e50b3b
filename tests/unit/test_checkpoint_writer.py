"""The shard writer: one pass over the bytes, torch.load-compatible files,
progress per chunk, and async copies that leave the loop but never race an optimizer step."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import zipfile

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from slurmtrain.common import checkpoint_format  # noqa: E402
from slurmtrain.compute.checkpoint import direct_io  # noqa: E402
from slurmtrain.compute.checkpoint.writer import ShardWriter  # noqa: E402


def _state():
    flat = torch.randn(3 << 20)  # 12 MiB: several write windows would be needed at a small window
    return {"w": flat[: 1 << 20].view(1024, 1024), "b": flat, "n": 7, "tied": flat[: 1 << 20]}


def test_a_shard_is_written_once_hashed_on_the_way_and_loads_with_torch_load(tmp_path, monkeypatch):
    # many windows: writeback kicks and waits run
    monkeypatch.setattr("slurmtrain.compute.checkpoint.writer._WINDOW", 1 << 20)
    monkeypatch.setattr(direct_io, "BUFFER", 1 << 20)  # many O_DIRECT buffers: each is a beat
    seen = []
    writer = ShardWriter(True, "checksum", progress=seen.append)
    writer.begin(5, str(tmp_path), deferred=False)
    state = _state()
    writer.save(state, str(tmp_path / "a.pt"))
    writer.save({"x": torch.arange(10)}, str(tmp_path / "b.pt"))
    report = writer.report(0)
    assert report["ok"], report["error"]
    size_a, size_b = ((tmp_path / n).stat().st_size for n in ("a.pt", "b.pt"))
    for name in ("a.pt", "b.pt"):
        assert report["files"][name]["crc32"] == checkpoint_format._digest(tmp_path / name)
        assert report["files"][name]["size"] == (tmp_path / name).stat().st_size
    assert (
        checkpoint_format.validate(tmp_path, full=True) is not None
    )  # no manifest here; digest is the check
    loaded = torch.load(tmp_path / "a.pt", weights_only=False)
    assert torch.equal(loaded["b"], state["b"]) and loaded["n"] == 7
    assert loaded["w"].untyped_storage().data_ptr() == loaded["b"].untyped_storage().data_ptr()
    # progress: this save's bytes so far, per chunk, up to both shards' sizes
    assert seen == sorted(seen) and len(seen) > 12 and seen[-1] == size_a + size_b
    assert size_a in seen


def test_zip_records_skip_torchs_own_crc_pass(tmp_path):
    """torch.save computed a CRC-32 of every record (a second pass over every byte, in miniz)
    beside ours: now the manifest's whole-file checksum is the only one."""
    writer = ShardWriter(True, "checksum")
    writer.begin(1, str(tmp_path), deferred=False)
    writer.save(_state(), str(tmp_path / "a.pt"))
    records = zipfile.ZipFile(tmp_path / "a.pt").infolist()
    data = [r for r in records if "/data/" in r.filename]
    assert data and all(r.CRC == 0 for r in data)
    assert all(r.compress_type == zipfile.ZIP_STORED for r in records)


def _optimizer_step_seen(writer):
    p = torch.nn.Parameter(torch.zeros(1))
    p.grad = torch.ones(1)
    torch.optim.SGD([p], lr=1.0).step()
    assert writer.steps_seen > 0


def test_async_copy_leaves_the_loop_and_the_next_optimizer_step_waits_for_it(tmp_path):
    writer = ShardWriter(True, "checksum")
    param = torch.nn.Parameter(torch.ones(1 << 20))
    opt = torch.optim.SGD([param], lr=1.0)
    writer.begin(1, str(tmp_path), deferred=True)
    writer.save({"p": param}, str(tmp_path / "early.pt"))
    assert not writer.pool.pending  # before any step was seen: copied at once (eager)
    _optimizer_step_seen(writer)

    writer.begin(2, str(tmp_path), deferred=True)
    writer.save({"p": param, "opt": opt.state_dict()}, str(tmp_path / "s.pt"))
    writer.host_copy_done()
    assert writer.pool.pending  # the copy has not happened: the loop did not pay for it
    before = param.detach().clone()
    param.grad = torch.ones_like(param)
    opt.step()  # the first write to a saved tensor: the hook copies first
    assert not writer.pool.pending and writer.seconds["step_wait"] > 0
    writer.flush()
    saved = torch.load(tmp_path / "s.pt", weights_only=False)["p"]
    assert torch.equal(saved, before) and not torch.equal(saved, param.detach())
    assert writer.report(0)["ok"]


def test_async_copy_done_by_the_writer_thread_first_costs_the_step_nothing(tmp_path):
    writer = ShardWriter(True, "checksum")
    _optimizer_step_seen(writer)
    param = torch.nn.Parameter(torch.ones(1000))
    opt = torch.optim.SGD([param], lr=1.0)
    writer.begin(3, str(tmp_path), deferred=True)
    writer.save({"p": param}, str(tmp_path / "s.pt"))
    writer.host_copy_done()
    writer.flush()  # the background thread: copies, then writes
    param.grad = torch.ones_like(param)
    opt.step()
    assert writer.seconds["step_wait"] == 0.0 and writer.seconds["copy"] > 0
    assert torch.equal(torch.load(tmp_path / "s.pt", weights_only=False)["p"], torch.ones(1000))


def test_load_reads_what_the_writer_wrote(tmp_path):
    writer = ShardWriter(True, "checksum")
    writer.begin(1, str(tmp_path), deferred=False)
    state = _state()
    writer.save(state, str(tmp_path / "a.pt"))
    loaded = writer.load(str(tmp_path / "a.pt"), map_location="cpu")
    assert torch.equal(loaded["w"], state["w"]) and loaded["n"] == 7


def _cached_pages(path) -> int:
    """How many of the file's pages sit in the page cache (mincore(2) on a mapping of it)."""
    size = os.path.getsize(path)
    pages = -(-size // mmap.PAGESIZE)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as mapped:
        libc = ctypes.CDLL(None, use_errno=True)
        vec = (ctypes.c_ubyte * pages)()
        view = memoryview(mapped)
        base = ctypes.c_void_p(direct_io._address(view))
        try:
            assert libc.mincore(base, ctypes.c_size_t(size), vec) == 0, os.strerror(
                ctypes.get_errno()
            )
        finally:
            view.release()
        return sum(v & 1 for v in vec)


def test_a_shard_goes_around_the_page_cache(tmp_path):
    """O_DIRECT writes from aligned buffers leave at most the file's last page in the page cache,
    whose copy (allocate, copy, write back, reclaim a page per 4 KiB) is what a synchronous save
    would spend its time on."""
    if direct_io.open_direct(str(tmp_path / "probe")) is None:
        pytest.skip("this filesystem has no O_DIRECT")
    writer = ShardWriter(True, "checksum")
    writer.begin(1, str(tmp_path), deferred=False)
    state = _state()
    writer.save(state, str(tmp_path / "a.pt"))
    report = writer.report(0)
    assert report["ok"], report["error"]
    path = tmp_path / "a.pt"
    assert _cached_pages(path) <= 1, "the shard was written through the page cache"
    assert report["files"]["a.pt"]["crc32"] == checkpoint_format._digest(path)
    loaded = torch.load(path, weights_only=True)
    assert torch.equal(loaded["b"], state["b"]) and loaded["n"] == 7


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, (1 << 20) + 3, 3 << 20])
def test_direct_file_writes_exactly_the_bytes_it_was_given(tmp_path, size):
    """Aligned buffers, a padded last block cut back by ftruncate, one CRC over the bytes."""
    data = os.urandom(size)
    fd = direct_io.open_direct(str(tmp_path / "f")) or os.open(tmp_path / "f", os.O_WRONLY)
    sink = direct_io.DirectFile(fd, True, buffers=direct_io.Buffers(1 << 20))
    try:
        for start in range(0, size, 300_001):  # pieces that straddle the buffers' edges
            sink.write(memoryview(data)[start : start + 300_001])
        sink.finish()
    finally:
        sink.close()
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == data
    assert (
        sink.checksum.hexdigest() == checkpoint_format._digest(tmp_path / "f")
        and sink.error is None
    )


def test_direct_file_keeps_the_disk_error(tmp_path):
    """A write the disk refuses (ENOSPC, from /dev/full) surfaces, and is kept for the report."""
    fd = os.open("/dev/full", os.O_WRONLY)
    sink = direct_io.DirectFile(fd, True, buffers=direct_io.Buffers(1 << 20))
    try:
        with pytest.raises(OSError) as raised:
            sink.write(bytes(3 << 20))
            sink.finish()
    finally:
        sink.close()
        os.close(fd)
    assert raised.value.errno == errno.ENOSPC and sink.error is raised.value


def test_a_full_disk_fails_the_save_with_the_real_error(tmp_path, monkeypatch):
    writer = ShardWriter(True, "checksum")
    writer.begin(1, str(tmp_path), deferred=False)
    monkeypatch.setattr(direct_io, "open_direct", lambda path: os.open("/dev/full", os.O_WRONLY))
    writer.save(_state(), str(tmp_path / "a.pt"))
    report = writer.report(0)
    assert not report["ok"] and "No space left" in report["error"], report["error"]
