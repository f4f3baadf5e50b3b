"""Tensor parallelism (parallel.tensor=2, DeepSpeed AutoTP) on 4 CPU ranks: TP 2 x DP 2 against
DeepSpeed without TP (one rank, accumulation 4), the same global batch 8 (micro 2).

One TP run: every logged loss equals the TP=1 run's within 1e-5, the validation loss (a TP group
evaluates the same held-out windows) equals TP=1's, and the export (the shards gathered into one
Hugging Face folder) gives the TP=1 weights' logits within 1e-4. A TP run killed and resumed, on the
same ranks and on half of them (TP 2 x DP 1, the global batch kept), is bench/tp_drill.py's, on the
local Slurm cluster (minutes: beyond the suite's budget).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.conftest import PARALLEL_ARGS, read_jsonl, run_cli, run_dirs

ARGS = ["cluster.cpu_tasks_per_node=4", *PARALLEL_ARGS]


def _losses(run: Path, key: str = "loss") -> dict[tuple[int, int], float]:
    rows = read_jsonl(run / "metrics.jsonl")
    return {(r["attempt"], r["step"]): r[key] for r in rows if r.get(key) is not None}


PROMPT = torch.tensor([list(b"def tensor_parallel(x):\n    return x\n")])


def _logits(folder: Path, checkpoint: Path | None = None) -> torch.Tensor:
    """The export's logits; with `checkpoint`, those of its consolidated weights (zero_to_fp32,
    in this process) loaded into the same model class."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True).eval()
    if checkpoint is not None:
        from slurmtrain.compute.weights import lazy_state_dict, materialize

        state = {k: materialize(v) for k, v in lazy_state_dict(checkpoint).items()}
        missing, unexpected = model.load_state_dict(state, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
        model.tie_weights()
    with torch.no_grad():
        return model(PROMPT).logits


def test_tp2_trains_validates_and_exports_like_tp1(workdir, parallel_reference):
    done = run_cli(ARGS + ["name=tp2", "parallel.tensor=2"], cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    plan = " ".join(done.stdout.split())  # the plan's lines wrap at 120 columns
    assert "data-parallel 2 (world 4 / tensor-parallel 2" in plan

    ref = parallel_reference  # one rank, accumulation 4: the same global batch
    [run] = run_dirs(workdir / "runs")
    want = {step: loss for (_, step), loss in _losses(ref).items()}
    got = _losses(run)
    assert {step for _, step in got} == set(range(1, 21))
    worst = max(abs(loss - want[step]) for (_, step), loss in got.items())
    print(f"TP=2 vs TP=1, 20 steps: largest loss difference {worst:.2e}")
    assert worst <= 1e-5
    valid = {step: v for (_, step), v in _losses(ref, "valid_loss").items()}
    got_valid = _losses(run, "valid_loss")
    assert {step for _, step in got_valid} == {10, 20} == set(valid)
    worst_valid = max(abs(v - valid[step]) for (_, step), v in got_valid.items())
    print(f"TP=2 vs TP=1 validation loss at steps 10, 20: largest difference {worst_valid:.2e}")
    assert worst_valid <= 1e-5
    step20 = run / "checkpoints" / "step_20"
    assert json.loads((step20 / "manifest.json").read_text())["tensor_parallel"] == 2
    assert (step20 / "mp_rank_01_model_states.pt").is_file()  # AutoTP's second shard

    out = workdir / "hf_tp2"
    done = run_cli(
        ["export", str(run), "--out", str(out), "--no-verify"], cwd=workdir, module="slurmtrain.cli"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (run / "checkpoints" / "step_20_universal").is_dir()  # the shards gathered there
    # TP=1's step 20 as its export would write it (the same consolidation, in this process)
    one = _logits(out, ref / "checkpoints" / "step_20")
    diff = float((_logits(out) - one).abs().max())
    print(f"TP=2 export vs TP=1 weights: largest logit difference {diff:.2e}")
    assert diff <= 1e-4
