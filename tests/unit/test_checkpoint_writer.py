"""The shard writer (issue 14 item 8): one pass over the bytes, torch.load-compatible files,
progress per chunk, and async copies that leave the loop but never race an optimizer step."""

from __future__ import annotations

import zipfile

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from slurmtrain.compute.checkpoint import format as ckpt  # noqa: E402
from slurmtrain.compute.checkpoint import writer as w  # noqa: E402


def _state():
    flat = torch.randn(3 << 20)  # 12 MiB: several write windows would be needed at a small window
    return {"w": flat[: 1 << 20].view(1024, 1024), "b": flat, "n": 7, "tied": flat[: 1 << 20]}


def test_a_shard_is_written_once_hashed_on_the_way_and_loads_with_torch_load(tmp_path, monkeypatch):
    monkeypatch.setattr(w, "_WINDOW", 1 << 20)  # many windows: writeback kicks and waits run
    seen = []
    writer = w.ShardWriter(True, "checksum", progress=seen.append)
    writer.begin(5, str(tmp_path), deferred=False)
    state = _state()
    writer.save(state, str(tmp_path / "a.pt"))
    writer.save({"x": torch.arange(10)}, str(tmp_path / "b.pt"))
    report = writer.report(0)
    assert report["ok"], report["error"]
    size_a, size_b = ((tmp_path / n).stat().st_size for n in ("a.pt", "b.pt"))
    for name in ("a.pt", "b.pt"):
        assert report["files"][name]["crc32"] == ckpt._digest(tmp_path / name)
        assert report["files"][name]["size"] == (tmp_path / name).stat().st_size
    assert ckpt.validate(tmp_path, full=True) is not None  # no manifest here; digest is the check
    loaded = torch.load(tmp_path / "a.pt", weights_only=False)
    assert torch.equal(loaded["b"], state["b"]) and loaded["n"] == 7
    assert loaded["w"].untyped_storage().data_ptr() == loaded["b"].untyped_storage().data_ptr()
    # progress: this save's bytes so far, per chunk, up to both shards' sizes
    assert seen == sorted(seen) and len(seen) > 12 and seen[-1] == size_a + size_b
    assert size_a in seen


def test_zip_records_skip_torchs_own_crc_pass(tmp_path):
    """torch.save computed a CRC-32 of every record (a second pass over every byte, in miniz)
    beside ours: now the manifest's whole-file checksum is the only one."""
    writer = w.ShardWriter(True, "checksum")
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
    writer = w.ShardWriter(True, "checksum")
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
    writer = w.ShardWriter(True, "checksum")
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
    writer = w.ShardWriter(True, "checksum")
    writer.begin(1, str(tmp_path), deferred=False)
    state = _state()
    writer.save(state, str(tmp_path / "a.pt"))
    loaded = writer.load(str(tmp_path / "a.pt"), map_location="cpu")
    assert torch.equal(loaded["w"], state["w"]) and loaded["n"] == 7
