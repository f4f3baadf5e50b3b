"""Branch a run, the parts that need no training: parsing, the parent's checks,
the pin that keeps a parent's step from its prune, the start a branch chooses, the schedule that
follows the branch's lr after a load, the lineage in the fingerprint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from slurmtrain.common import checkpoint_format, checkpoint_pins, events
from slurmtrain.common.errors import ConfigError
from slurmtrain.compute.checkpoint import select
from slurmtrain.login import branch


def _publish(root: Path, step: int, **meta) -> Path:
    tmp = root / f"{checkpoint_format.tag(step)}.tmp"
    tmp.mkdir(parents=True)
    (tmp / "shard_rank0.pt").write_bytes(b"x" * 64)
    return checkpoint_format.publish(root, step, {"world_size": 2, **meta}, "checksum")


def _parent(tmp_path: Path, steps=(5, 10), **model) -> Path:
    run = tmp_path / "runs" / "demo" / "aaaaaaaaaaaa"
    run.mkdir(parents=True)
    cfg = {
        "name": "demo",
        "model": {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "ffn_dim": 256, **model},
        "deepspeed": {"stage": 2},
        "optim": {"lr": 1e-3},
        "train": {"max_steps": 40},
    }
    (run / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    for step in steps:
        _publish(run / "checkpoints", step, data_position={"skipped_samples": 8})
    return run


def _child_cfg(tmp_path: Path, resume_from: str, **train):
    return OmegaConf.create(
        {
            "name": "demo",
            "runs_root": str(tmp_path / "runs"),
            "resume_from": resume_from,
            "branch_of": None,
            "model": {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "ffn_dim": 256},
            "deepspeed": {"stage": 2},
            "data": {"skip_samples": 0},
            "smoke": train.get("smoke", False),
            "nodes": train.get("nodes", 1),
            "gpus_per_node": 0,
            "cluster": {"cpu_tasks_per_node": 2},
            "optim": {"lr": 5e-4},
            "train": {"max_steps": train.get("max_steps", 20)},
        }
    )


def test_parse_run_and_step():
    assert branch.parse("runs/demo/abc:step_10") == ("runs/demo/abc", 10)
    assert branch.parse("runs/demo/abc:10") == ("runs/demo/abc", 10)
    assert branch.parse("demo") == ("demo", None)
    with pytest.raises(ConfigError, match="resume_from=':step_3'"):
        branch.parse(":step_3")


def test_resolve_by_path_name_and_fingerprint_writes_the_lineage(tmp_path):
    parent = _parent(tmp_path)
    for spec in (f"{parent}:step_5", "demo:step_5", "aaaaaaaaaaaa:step_5"):
        cfg = _child_cfg(tmp_path, spec)
        branch.resolve(cfg)
        assert cfg.resume_from == f"{parent}:step_5" and cfg.branch_of == "aaaaaaaaaaaa:step_5"
    newest = _child_cfg(tmp_path, str(parent))
    branch.resolve(newest)
    assert newest.branch_of == "aaaaaaaaaaaa:step_10"  # no step: the newest valid one


def test_resolve_refuses_another_shape_a_missing_step_and_a_short_run(tmp_path):
    parent = _parent(tmp_path, num_layers=4)
    with pytest.raises(ConfigError, match=r"model.num_layers \(4 there, 2 here\)"):
        branch.resolve(_child_cfg(tmp_path, str(parent)))
    parent = _parent(tmp_path / "b")
    with pytest.raises(ConfigError, match="step_7: no such checkpoint.*step_10, step_5"):
        branch.resolve(_child_cfg(tmp_path / "b", f"{parent}:step_7"))
    with pytest.raises(ConfigError, match="train.max_steps=10: the branch starts at step 10"):
        branch.resolve(_child_cfg(tmp_path / "b", f"{parent}:step_10", max_steps=10))
    (parent / "checkpoints" / "step_10" / "shard_rank0.pt").write_bytes(b"short")
    with pytest.raises(ConfigError, match="step_10: shard_rank0.pt: 5 bytes, manifest says 64"):
        branch.resolve(_child_cfg(tmp_path / "b", f"{parent}:step_10"))
    with pytest.raises(ConfigError, match=r"nodes=2: .*saved by 2 ranks and this branch runs 4"):
        branch.resolve(_child_cfg(tmp_path / "b", f"{parent}:step_5", nodes=2))
    branch.resolve(_child_cfg(tmp_path / "b", f"{parent}:step_5", nodes="1-2"))  # 1 node fits
    with pytest.raises(ConfigError, match="smoke=true: not for a branch"):
        branch.resolve(_child_cfg(tmp_path / "b", f"{parent}:step_5", smoke=True))
    with pytest.raises(ConfigError, match="no run directory there"):
        branch.resolve(_child_cfg(tmp_path / "b", "nosuchrun"))


def test_a_parent_written_before_the_model_families_branches_and_another_family_is_refused(
    tmp_path,
):
    parent = _parent(tmp_path)  # its config.yaml has no model.family/num_kv_heads/hf_extra
    cfg = _child_cfg(tmp_path, f"{parent}:step_5")
    cfg.model.update(family="opt", num_kv_heads=None, tie_embeddings=True, hf_extra={})
    branch.resolve(cfg)
    other = _child_cfg(tmp_path, f"{parent}:step_5")
    other.model.family = "llama"
    with pytest.raises(ConfigError, match=r"model.family \(opt there, llama here\)"):
        branch.resolve(other)


def test_skip_samples_without_a_branch_is_refused(tmp_path):
    cfg = _child_cfg(tmp_path, None)
    cfg.data.skip_samples = 64
    with pytest.raises(ConfigError, match="data.skip_samples=64: .*resume_from"):
        branch.resolve(cfg)


def test_prune_keeps_a_pinned_step(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (10, 20, 30, 40):
        _publish(root, step)
    checkpoint_pins.pin(root, 10, "bbbbbbbbbbbb")
    checkpoint_format.prune(root, keep_last=2)
    assert sorted(d.name for d in checkpoint_format.step_dirs(root)) == [
        "step_10",
        "step_30",
        "step_40",
    ]
    assert checkpoint_pins.pinned_steps(root) == {10: ["bbbbbbbbbbbb"]}


def test_a_branch_starts_at_the_parent_step_until_it_has_its_own(tmp_path):
    parent = _parent(tmp_path)
    own = tmp_path / "child" / "checkpoints"
    checkpoint_pins.pin(parent / "checkpoints", 5, "child")
    spec = (f"{parent}:step_5", 64)
    choice = select.choose(own, [], "auto", True, branch=spec)
    assert choice.stop is None and choice.found.path == parent / "checkpoints" / "step_5"
    assert choice.found.manifest["step"] == 5
    assert choice.found.manifest["data_position"]["skipped_samples"] == 8 + 64
    before = (parent / "checkpoints" / "step_5" / "manifest.json").read_text()
    assert json.loads(before)["data_position"]["skipped_samples"] == 8  # read, never written

    _publish(own, 7)
    saved = [{"event": "checkpoint_saved", "step": 7}]
    choice = select.choose(own, saved, "auto", True, branch=spec)
    assert choice.found.path == own / "step_7"  # its own checkpoints take precedence
    assert (
        checkpoint_pins.pinned_steps(parent / "checkpoints") == {}
    )  # and the parent's step is released

    again = select.choose(own, saved, "none", True, branch=spec)  # resume=none: the branch point
    assert again.found.path == parent / "checkpoints" / "step_5" and again.applied.moved
    assert not (own / "step_7").exists()  # moved aside to discarded/, not deleted

    gone = select.choose(tmp_path / "c2", [], "auto", True, branch=(f"{parent}:step_6", 0))
    assert gone.found.path is None and "resume_from=" in gone.stop and "no such" in gone.stop


def test_the_schedule_follows_the_config_lr_after_loading_another_peak():
    """The finding: LambdaLR's saved base_lrs (and DeepSpeed's restored optimizer groups) kept
    the parent's peak lr, so a branch with optim.lr lowered trained at the old lr."""
    import torch

    from slurmtrain.common.ds_config import lr_at, lr_scheduler

    def schedule(lr: float, wd: float = 0.01):
        optim = {"lr": lr, "min_lr": lr / 10, "warmup_steps": 2, "weight_decay": wd}
        optim.update(beta1=0.9, beta2=0.95, eps=1e-8)
        cfg = OmegaConf.create({"optim": optim, "train": {"max_steps": 40}})
        opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=lr, weight_decay=wd)
        return opt, lr_scheduler(cfg)(opt)

    opt, old = schedule(1e-3)
    for _ in range(10):
        opt.step()
        old.step()
    saved_opt, saved_sched = opt.state_dict(), old.state_dict()
    opt, new = schedule(5e-4, wd=0.1)
    new.load_state_dict(saved_sched)
    opt.load_state_dict(saved_opt)  # DeepSpeed restores the optimizer after the scheduler
    new.follow_config()  # what Checkpointer.load does after DeepSpeed's load
    assert opt.param_groups[0]["lr"] == pytest.approx(lr_at(10, 5e-4, 5e-5, 2, 40))
    assert opt.param_groups[0]["weight_decay"] == 0.1  # the branch's, not the saved 0.01
    opt.step()
    new.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(lr_at(11, 5e-4, 5e-5, 2, 40))


def test_the_lineage_is_in_the_fingerprint_and_changed_keys_name_the_differences():
    from slurmtrain.common.rundir import fingerprint

    base = {"optim": {"lr": 1e-3}, "resume_from": "/a:step_5", "branch_of": "fp:step_5"}
    other_step = {**base, "resume_from": "/a:step_10", "branch_of": "fp:step_10"}
    moved = {**base, "resume_from": "/elsewhere/a:step_5"}
    fp = fingerprint(None, base)  # type: ignore[arg-type]
    assert fp != fingerprint(None, other_step)  # type: ignore[arg-type]
    assert fp == fingerprint(None, moved)  # type: ignore[arg-type]  the path is not identity
    changed = branch.changed_keys(
        {"optim": {"lr": 1e-3}, "data": {"skip_samples": 0}, "name": "a"},
        {**base, "optim": {"lr": 5e-4}, "data": {"skip_samples": 64}, "name": "b"},
    )
    assert changed == {"data.skip_samples": [0, 64], "optim.lr": [0.001, 0.0005]}
    line = branch.lineage_line([events.Branched(parent="/r/p", step=5, changed=changed)])
    assert (
        line
        == "branched from /r/p at step_5 (changed: data.skip_samples 0->64, optim.lr 0.001->0.0005)"
    )
