"""data=text end to end: a 10k-record jsonl tokenized at submit with a local tokenizer folder trains,
is killed, and the resubmission reuses the cached tokens (nothing tokenized again) and resumes
bitwise: the steps computed before the crash and again after it have the same losses.
(A parquet file of the same records gives byte-identical tokens: tests/unit/test_text_corpus.py.)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from slurmtrain.common.events import CheckpointLoaded
from tests.conftest import ledger_events, read_jsonl, run_cli, run_dirs

ARGS = [
    "cluster=local",
    "cluster.cpu_tasks_per_node=1",
    "data=text",
    "data.seq_len=32",
    "train.max_steps=8",
    "train.log_interval=1",
    "checkpoint.interval_steps=4",
    "train.global_batch_size=8",
    "train.micro_batch_size=4",
    "name=text",
]


def test_jsonl_with_a_tokenizer_trains_is_killed_reuses_the_cache_and_resumes_bitwise(tmp_path):
    from tests.unit.test_prepare_data import _tiny_tokenizer

    folder = _tiny_tokenizer(tmp_path)
    docs = [f"def add(a, b):\n    return a + b  # {i}\nthe quick brown fox" for i in range(10_000)]
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in enumerate(docs)))
    args = [*ARGS, f"data.path={corpus}", f"data.tokenizer={folder}"]

    crashed = run_cli(
        [*args, "faults.allow_inject=true"],
        cwd=tmp_path,
        env={"SLURMTRAIN_INJECT": "crash_at_step=7"},
    )
    assert crashed.returncode != 0
    assert "data: tokenizing" in crashed.stdout, crashed.stdout + crashed.stderr
    # stdout is a pipe here: plain progress lines, not a bar drawn once at the end (#36)
    assert re.search(r"^train: step \d/8, loss \d", crashed.stdout, re.M), crashed.stdout
    [entry] = [p for p in (tmp_path / "runs" / ".tokenized").iterdir() if p.is_dir()]
    meta = json.loads((entry / "tokens.json").read_text())
    assert meta["documents"] == 10_000 and meta["tokenizer"] == str(folder.resolve())
    built = (entry / "tokens.bin").stat().st_mtime_ns

    resumed = run_cli(args, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "data: reusing" in resumed.stdout and "tokenizing" not in resumed.stdout
    assert (entry / "tokens.bin").stat().st_mtime_ns == built  # not written again
    assert "resuming" in resumed.stdout
    said = [ln for ln in resumed.stdout.splitlines() if "resumed from" in ln]  # #36
    assert len(said) == 1 and said[0].startswith("slurmtrain: resumed from step_4 ("), said
    assert re.search(r"step_4, saved \d+s ago\)$", said[0]), said

    [run] = run_dirs(tmp_path / "runs")
    [loaded] = [e for e in ledger_events(run) if isinstance(e, CheckpointLoaded)]
    assert loaded.step == 4
    losses: dict[int, list[float]] = {}
    for row in read_jsonl(run / "metrics.jsonl"):
        if "loss" in row:
            losses.setdefault(row["step"], []).append(row["loss"])
    assert sorted(losses) == list(range(1, 9))
    again = {s: v for s, v in losses.items() if len(v) == 2}  # before the crash and after it
    assert sorted(again) == [5, 6, 7] or sorted(again) == [5, 6], losses
    assert all(v[0] == v[1] for v in again.values()), again  # bitwise
    config = (run / "config.yaml").read_text()
    assert f"tokens_path: {entry / 'tokens.bin'}" in config and meta["text_checksum"] in config
    assert Path(config.split("tokens_path: ")[1].split()[0]).is_file()
