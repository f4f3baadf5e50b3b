"""Fault matrix: every fault on the real cluster, N trials each, one table of what happened.

    python bench/fault_matrix.py [--trials 3] [--faults crash_loop,hang_one_rank] [--list]

Needs the local Slurm cluster (tools/slurm_cluster.py start) and root for the ones that kill a
slurmd, mount a tmpfs or restart slurmctld. Each trial is a short opt_tiny run (20-60 steps, 2 nodes
x 1 CPU rank) submitted through `python -m slurmtrain` as a user would; the fault is produced the
way tests/cluster produces it (SLURMTRAIN_INJECT, a high-priority hog, a killed slurmd, flipped
bytes, a full tmpfs, `sbatch job.sbatch` by hand, `restart-ctld`, `scancel --batch`). Every figure
comes from the run's ledger and metrics.jsonl:

- recovered: the run ended as expected (finished, or stopped with the expected class), with no
  duplicate trainer and no corrupt resume
- steps lost (max): over attempt boundaries, steps trained by an attempt beyond the checkpoint the
  next one loaded (what a restart recomputes)
- duplicate trainers: trials where two jobs trained the run at once (metrics of one attempt written
  after the next one's began, or two job ids writing the same attempt)
- corrupt resumes: a `checkpoint_loaded` of a checkpoint never published (`.tmp`, a step with no
  `checkpoint_saved`) or one the trial corrupted
- class ok: the ledger holds the class/event the fault must be recorded as
  or passes its recipe's own check (bench/fault_recipes_local.py: the resumed attempt's
  `resume_source` tiers; batch-node loss: the successor resumed it, nothing left in the queue),
  which a run must pass to count as recovered
- culprit: the node the fault put at fault against the one the attempt's verdict named, with its
  confidence, and precision and recall per fault (bench/fault_culprit.py); then the same over every
  node-at-fault trial, and the nodes blamed for configuration/user errors (there must be none)

Faults whose handling is being built elsewhere carry the outcome they must have once merged
(nan_loss: `rollback` then finished; all_checkpoints_corrupt: stopped `checkpoint_unreadable`;
duplicate_submission: `duplicate_refused`); until then their row says no.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fault_culprit import figures, row_fields, score, summary  # noqa: E402
from fault_recipes import FAULTS  # noqa: E402
from fault_trial import FINISHED, STOPPED, Check, Expect, Trial, Want  # noqa: E402
from metric_fields import integer, number  # noqa: E402

from slurmtrain.common import events  # noqa: E402  (fault_trial put the repository on the path)
from slurmtrain.common.events import FailureClass  # noqa: E402

# --- figures from the ledger and metrics -----------------------------------------------------


def steps_lost(t: Trial) -> int:
    """Max over attempt boundaries of (last step attempt k trained) - (step attempt k+1 loaded)."""
    by_attempt: dict[int, int] = {}
    for r in t.metrics():
        attempt, step = integer(r, "attempt"), integer(r, "step")
        if attempt is not None and step is not None:
            by_attempt[attempt] = max(by_attempt.get(attempt, 0), step)
    loaded = {e.attempt: e.step or 0 for e in t.of(events.CheckpointLoaded)}
    attempts = sorted(by_attempt)
    lost = 0
    for prev, nxt in zip(attempts, attempts[1:]):
        if nxt in loaded or nxt in by_attempt:
            lost = max(lost, by_attempt[prev] - loaded.get(nxt, 0))
    return lost


OWN_EVENTS = (
    events.CheckpointSaved,
    events.CheckpointLoaded,
    events.Finished,
    events.Signal,
    events.Paused,
    events.Failed,
)


def duplicate_trainers(t: Trial) -> bool:
    """Two jobs trained the run at once: an attempt started while an earlier one still trained
    (its own rows: metrics and what its ranks recorded, not what a closer wrote about it later),
    or one step logged twice within one attempt."""
    ev = t.events()
    spans: dict[int, list[float]] = {}  # attempt -> [started, its last own row]
    jobs: dict[int, str] = {}  # attempt -> the job it started in
    for e in ev:
        if isinstance(e, events.Started) and e.attempt is not None:
            spans[e.attempt] = [e.time] * 2
            jobs[e.attempt] = str(e.job_id)
    own = [
        (e.attempt, e.time)
        for e in ev
        if e.attempt is not None
        and isinstance(e, OWN_EVENTS)
        and str(e.job_id) == jobs.get(e.attempt)
    ]
    rows = t.metrics()
    for a, ts in own + [(integer(r, "attempt"), number(r, "time")) for r in rows]:
        if a is not None and a in spans:
            spans[a][1] = max(spans[a][1], ts)
    ordered = [spans[a] for a in sorted(spans)]
    if any(prev[1] > nxt[0] for prev, nxt in zip(ordered, ordered[1:])):
        return True
    # An in-process rollback retrains the steps after the checkpoint it went back to, in the same
    # attempt: a step counts twice only within one stretch between rollbacks.
    rollbacks = sorted(e.time for e in ev if isinstance(e, events.Rollback))
    seen: dict[tuple[Optional[int], int, Optional[int]], int] = {}
    for r in rows:
        at = number(r, "time")
        key = (integer(r, "attempt"), sum(t <= at for t in rollbacks), integer(r, "step"))
        seen[key] = seen.get(key, 0) + 1
    return any(n > 1 for n in seen.values())


def corrupt_resumes(t: Trial) -> int:
    saved = {e.step for e in t.of(events.CheckpointSaved)}
    # a node-local copy is published with no ledger row: its resume_source rows vouch for it (the
    # tier checksummed it), unless the trial corrupted the buddy copy it came from
    local: dict[tuple[Optional[int], Optional[int]], set[str]] = {}
    for r in t.of(events.ResumeSource):
        if r.tier != "shared":
            local.setdefault((r.attempt, r.step), set()).add(str(r.tier))
    bad = 0
    for e in t.of(events.CheckpointLoaded):
        name = Path(e.path or "").name.removesuffix("_universal")
        tiers = local.get((e.attempt, e.step), set())
        buddy_bad = "buddy" in tiers and f"buddy:{name}" in t.corrupted
        published = e.step in saved or bool(tiers)
        if name.endswith(".tmp") or name in t.corrupted or buddy_bad or not published:
            bad += 1
    return bad


def class_recorded(t: Trial, want: Want) -> bool:
    if isinstance(want, Check):  # the recipe's own verdict; what was wrong goes to the notes
        problem = want.problem(t)
        t.notes.extend([f"{want.what}: {problem}"] if problem else [])
        return problem is None
    ev = t.events()
    if want == Expect.nothing_failed:  # one clean chain, no failure recorded
        return not any(isinstance(e, (events.Failed, events.Stopped)) for e in ev)
    if want == Expect.first_attempt_failed:
        ended = [e for e in ev if isinstance(e, events.AttemptEnded) and e.attempt == 1]
        return bool(ended) and ended[0].cls not in (events.Finished.kind, FailureClass.cancelled)
    if isinstance(want, type):
        return any(isinstance(e, want) for e in ev)
    failures = (events.AttemptEnded, events.Stopped, events.Failed)
    return want in {e.cls for e in ev if isinstance(e, failures)}


def trial(fault: str, index: int, keep: bool) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"fm-{fault}-"))
    t = Trial(workdir, f"fm-{fault.replace('_', '-')}-{index}-{int(time.time()) % 100000}")
    t.index = index
    row: dict[str, Any] = {"fault": fault}
    try:
        outcome, want = FAULTS[fault](t)
        end = t.wait_end()
        dup, corrupt, class_ok = duplicate_trainers(t), corrupt_resumes(t), class_recorded(t, want)
        row.update(
            # recovered: ended as it must (a stop only with its class), one trainer, no bad resume
            recovered=end == outcome
            and (outcome != STOPPED or class_ok)
            and (class_ok or not isinstance(want, Check))
            and not dup
            and corrupt == 0,
            lost=steps_lost(t),
            dup=dup,
            corrupt=corrupt,
            class_ok=class_ok,
            end=end,
            notes="; ".join(t.notes),
            **row_fields(score(fault, t)),
        )
    except Exception as err:  # noqa: BLE001  a trial that breaks is a row that says so
        row.update(
            recovered=False,
            lost=None,
            dup=None,
            corrupt=None,
            class_ok=False,
            end=f"error: {err}"[:120],
        )
        subprocess.run(["scancel", "--name", f"st-{t.name}"], capture_output=True)
    finally:
        for fn in reversed(t.cleanup):
            fn()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    row["run"] = str(t.run) if keep else ""
    print(f"  {fault} #{index}: {row}", file=sys.stderr, flush=True)
    return row


def table(rows: list[dict[str, Any]]) -> str:
    head = [
        "fault",
        "trials",
        "recovered",
        "steps lost (max)",
        "duplicate trainers",
        "corrupt resumes",
        "class recorded correctly",
        "culprit precision",
        "culprit recall",
    ]
    lines = [head]
    faults = list(dict.fromkeys(r["fault"] for r in rows))
    for fault in faults:
        rs = [r for r in rows if r["fault"] == fault]
        lost = [r["lost"] for r in rs if r["lost"] is not None]
        lines.append(
            [
                fault,
                str(len(rs)),
                f"{sum(bool(r['recovered']) for r in rs)}/{len(rs)}",
                str(max(lost)) if lost else "-",
                str(sum(bool(r["dup"]) for r in rs)),
                str(sum(r["corrupt"] or 0 for r in rs)),
                f"{sum(bool(r['class_ok']) for r in rs)}/{len(rs)}",
                *figures(rs)[1:],
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = [" | ".join(c.ljust(w) for c, w in zip(line, widths)) for line in lines]
    out.insert(1, "-+-".join("-" * w for w in widths))
    culprits = [f"culprit, {f}: {figures([r for r in rows if r['fault'] == f])[0]}" for f in faults]
    return "\n".join(out + [c for c in culprits if not c.endswith(": -")] + summary(rows))


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--faults", default=",".join(FAULTS), help="comma-separated subset")
    p.add_argument("--keep", action="store_true", help="keep the trials' run directories")
    p.add_argument("--list", action="store_true", help="list the faults and exit")
    a = p.parse_args(argv)
    if a.list:
        print("\n".join(FAULTS))
        return
    chosen = [f.strip() for f in a.faults.split(",") if f.strip()]
    unknown = [f for f in chosen if f not in FAULTS]
    if unknown:
        p.error(f"--faults: unknown {', '.join(unknown)}; one of {', '.join(FAULTS)}")
    if a.trials < 1:
        p.error("--trials: at least 1")
    rows = [trial(f, i, a.keep) for f in chosen for i in range(1, a.trials + 1)]
    print(table(rows))
    details = [r for r in rows if r.get("end") not in (FINISHED, STOPPED) or not r["recovered"]]
    for r in details:
        print(f"{r['fault']}: {r['end']} {r.get('notes', '')}".rstrip())


if __name__ == "__main__":
    main()
