"""The checkpoint protocol's pure parts: publish, validation, fallback, pruning, markers, host copy."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from slurmtrain.common import checkpoint_format
from slurmtrain.compute.checkpoint import manager


def _stage(root: Path, step: int, files: dict[str, bytes]) -> Path:
    tmp = root / f"step_{step}.tmp"
    tmp.mkdir(parents=True)
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    return tmp


def _save(root: Path, step: int, payload: bytes = b"x" * 100) -> Path:
    _stage(root, step, {"shard_rank0.pt": payload, "shard_rank1.pt": payload[::-1] + b"!"})
    return checkpoint_format.publish(root, step, {"world_size": 2}, "checksum")


def test_publish_writes_manifest_renames_and_points_latest(tmp_path):
    final = _save(tmp_path, 10)
    assert final == tmp_path / "step_10" and not (tmp_path / "step_10.tmp").exists()
    assert (tmp_path / "latest").read_text() == "step_10"
    manifest = checkpoint_format.read_manifest(final)
    assert manifest["step"] == 10 and manifest["world_size"] == 2
    assert set(manifest["files"]) == {"shard_rank0.pt", "shard_rank1.pt"}
    assert checkpoint_format.validate(final) is None
    assert not list(tmp_path.glob(".latest*"))


def test_publish_uses_the_writers_reports_and_hashes_only_unlisted_files(tmp_path):
    _stage(tmp_path, 5, {"a.pt": b"aaaa", "b.pt": b"bbbb"})
    report = {
        "rank": 1,
        "ok": True,
        "error": None,
        "files": {"a.pt": {"size": 4, "crc32": "reported-by-rank-1"}},
    }
    (tmp_path / "step_5.tmp" / ".done_rank1.json").write_text(json.dumps(report))
    final = checkpoint_format.publish(tmp_path, 5, {}, "checksum", [report])
    files = checkpoint_format.read_manifest(final)["files"]
    assert files["a.pt"]["crc32"] == "reported-by-rank-1"  # not re-read by rank 0
    assert len(files["b.pt"]["crc32"]) == 8  # written outside our engine: hashed here
    assert not (final / ".done_rank1.json").exists()  # markers do not outlive the save


def test_a_lost_write_fails_the_publish_and_changes_nothing_visible(tmp_path):
    _save(tmp_path, 10)
    _stage(tmp_path, 20, {"a.pt": b"short"})
    report = {"rank": 0, "ok": True, "error": None, "files": {"a.pt": {"size": 999}}}
    with pytest.raises(OSError, match="999"):
        checkpoint_format.publish(tmp_path, 20, {}, "size", [report])
    assert (tmp_path / "latest").read_text() == "step_10"
    assert not (tmp_path / "step_20").exists() and not list(tmp_path.glob(".latest*"))


def test_republishing_a_step_replaces_the_stale_copy_whole(tmp_path):
    _save(tmp_path, 10, b"old" * 10)
    _stage(tmp_path, 10, {"only_new.pt": b"new"})
    final = checkpoint_format.publish(tmp_path, 10, {}, "checksum")
    assert sorted(p.name for p in final.iterdir()) == ["manifest.json", "only_new.pt"]
    assert not (tmp_path / "step_10.old").exists()


def test_flipped_bytes_are_a_checksum_mismatch_and_a_zero_byte_shard_a_size_mismatch(tmp_path):
    flipped, empty = _save(tmp_path, 10), _save(tmp_path, 20)
    shard = flipped / "shard_rank0.pt"
    data = bytearray(shard.read_bytes())
    data[40] ^= 0xFF
    shard.write_bytes(bytes(data))
    (empty / "shard_rank1.pt").write_bytes(b"")
    assert "checksum mismatch" in checkpoint_format.validate(flipped)
    assert (
        checkpoint_format.validate(flipped, full=False) is None
    )  # verify=size cannot see flipped bytes
    assert (
        checkpoint_format.validate(empty, full=False)
        == "shard_rank1.pt: 0 bytes, manifest says 101"
    )


def test_find_resumable_walks_back_and_says_why_it_skipped(tmp_path):
    _save(tmp_path, 10)
    _save(tmp_path, 20)
    newest = _save(tmp_path, 30)
    (newest / "shard_rank0.pt").write_bytes(b"y" * 100)
    (tmp_path / "step_20" / "manifest.json").unlink()
    _stage(tmp_path, 40, {"half.pt": b"h"})  # an unfinished save: never a candidate
    found = checkpoint_format.find_resumable(tmp_path)
    assert found.path == tmp_path / "step_10" and found.manifest["step"] == 10
    assert [(Path(p).name, r) for p, r in found.skipped] == [
        ("step_30", "shard_rank0.pt: checksum mismatch (corrupt)"),
        ("step_20", "no manifest (save did not finish)"),
    ]


def test_find_resumable_on_a_missing_or_empty_root_finds_nothing(tmp_path):
    assert checkpoint_format.find_resumable(tmp_path / "nope").path is None
    assert checkpoint_format.find_resumable(tmp_path).path is None


def test_prune_keeps_the_last_k_every_nth_and_latest_and_drops_leftovers(tmp_path):
    for step in (10, 20, 30, 40, 50):
        _save(tmp_path, step)
    (tmp_path / "step_10_universal").mkdir()
    (tmp_path / "step_40_universal").mkdir()
    _stage(tmp_path, 60, {"half.pt": b"h"})
    (tmp_path / ".step_60.tmp.failed_rank3").touch()
    removed = checkpoint_format.prune(tmp_path, keep_last=2, keep_every=20)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["latest", "step_20", "step_40", "step_40_universal", "step_50"]
    assert sorted(p.name for p in removed) == ["step_10", "step_30"]


def test_markers_round_trip_and_a_failed_rank_is_reported(tmp_path):
    tmp = tmp_path / "step_7.tmp"
    tmp.mkdir()
    done = {"rank": 1, "ok": True, "error": None, "files": {"f.pt": {"size": 3}}}
    failed = {"rank": 2, "ok": False, "error": "ENOSPC", "files": {}}
    assert manager._read_marker(tmp, 1) is None
    manager._write_marker(tmp, done)
    manager._write_marker(tmp, failed)
    assert manager._read_marker(tmp, 1) == done
    assert manager._read_marker(tmp, 2) == failed
    assert not list(tmp.glob("*.part"))


def test_a_rank_that_cannot_write_into_the_directory_leaves_a_marker_beside_it(tmp_path):
    tmp = tmp_path / "step_7.tmp"  # never created (mkdir failed on that rank)
    manager._write_marker(tmp, {"rank": 3, "ok": False, "error": "ENOSPC", "files": {}})
    assert manager._read_marker(tmp, 3)["ok"] is False


def test_host_copy_keeps_views_shared_metadata_and_is_independent_of_the_source():
    torch = pytest.importorskip("torch")
    from slurmtrain.compute.checkpoint.writer import HostPool

    flat = torch.arange(10.0, requires_grad=True)
    state = collections.OrderedDict(whole=flat, view=flat.detach()[2:5], step=torch.tensor(3))
    state._metadata = {"": {"version": 1}}  # what nn.Module.state_dict() attaches
    Pair = collections.namedtuple("Pair", "a b")
    obj = {"model": state, "pair": Pair(1, [flat.detach()[:2]]), "note": "x"}
    pool = HostPool()
    pool.begin()
    copy = pool.copy(obj)
    with torch.no_grad():
        flat.add_(100)  # training goes on after the copy
    assert torch.equal(copy["model"]["whole"], torch.arange(10.0))
    assert copy["model"]["whole"].requires_grad
    assert (
        copy["model"]["view"].untyped_storage().data_ptr()
        == copy["model"]["whole"].untyped_storage().data_ptr()
    )
    assert copy["model"]._metadata == {"": {"version": 1}}
    assert isinstance(copy["pair"], Pair) and torch.equal(
        copy["pair"].b[0], torch.tensor([0.0, 1.0])
    )
    buffers = [b.data_ptr() for b in pool.buffers]
    pool.begin()
    pool.copy(obj)
    assert [b.data_ptr() for b in pool.buffers] == buffers  # the next save reuses the buffers


def test_host_copy_saves_the_same_bytes_as_the_live_state(tmp_path):
    torch = pytest.importorskip("torch")
    from slurmtrain.compute.checkpoint.writer import HostPool

    flat = torch.randn(64)
    state = {"w": flat[:32].view(4, 8), "b": flat[32:], "tied": flat[:32].view(4, 8)}
    (tmp_path / "live").mkdir()
    (tmp_path / "copy").mkdir()
    torch.save(state, tmp_path / "live" / "s.pt")  # the archive is named after the file
    pool = HostPool()
    pool.begin()
    torch.save(pool.copy(state), tmp_path / "copy" / "s.pt")
    assert (tmp_path / "live" / "s.pt").read_bytes() == (tmp_path / "copy" / "s.pt").read_bytes()


def test_shard_writer_keeps_a_write_error_instead_of_raising(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("deepspeed")
    from slurmtrain.compute.checkpoint.writer import ShardWriter

    written = []
    writer = ShardWriter(True, "checksum", hook=lambda step, name: written.append((step, name)))
    target = tmp_path / "step_3.tmp"
    writer.begin(3, str(target), deferred=False)
    writer.makedirs(str(target), exist_ok=True)
    writer.save({"t": torch.ones(3)}, str(target / "ok.pt"))
    entry = writer.report(0)["files"]["ok.pt"]
    assert entry["crc32"] == checkpoint_format._digest(
        target / "ok.pt"
    )  # hashed on the way, not re-read
    assert entry["size"] == (target / "ok.pt").stat().st_size
    writer.save({"t": torch.ones(3)}, str(target / "gone" / "bad.pt"))  # this write fails
    writer.save({"t": torch.ones(3)}, str(target / "after.pt"))  # skipped: the save failed
    report = writer.report(0)
    assert report["ok"] is False and "bad.pt" in report["error"]
    assert written == [(3, "ok.pt")]
    assert list(target.iterdir()) == []  # what it wrote is freed: a full disk gets room back


def test_a_universal_conversion_is_reused_only_if_made_from_this_very_save(tmp_path):
    from slurmtrain.compute.checkpoint import reshape

    step = _save(tmp_path, 20)
    source = checkpoint_format.read_manifest(step)
    assert reshape.cached(step, source) is None
    tmp = tmp_path / "step_20_universal.tmp"
    tmp.mkdir()
    (tmp / "zero.pt").write_bytes(b"z")
    checkpoint_format.seal(
        tmp, reshape.universal_dir(step), {"source": {"step": 20, "time": source["time"]}}, "size"
    )
    assert reshape.cached(step, source) == tmp_path / "step_20_universal"
    assert reshape.cached(step, {**source, "time": source["time"] + 1}) is None  # re-saved since
    (tmp_path / "step_20_universal" / "zero.pt").write_bytes(b"")
    assert reshape.cached(step, source) is None  # damaged: converted again


def test_manifests_written_with_sha256_still_verify(tmp_path):
    import hashlib

    final = _save(tmp_path, 10)
    manifest = json.loads((final / "manifest.json").read_text())
    for name, entry in manifest["files"].items():
        entry.pop("crc32")
        entry["sha256"] = hashlib.sha256((final / name).read_bytes()).hexdigest()
    (final / "manifest.json").write_text(json.dumps(manifest))
    assert checkpoint_format.validate(final) is None
    shard = final / "shard_rank0.pt"
    shard.write_bytes(b"y" + shard.read_bytes()[1:])
    assert "checksum mismatch" in checkpoint_format.validate(final)
