"""Who failed an attempt: the culprit rank and node behind the supervisor's verdict, with evidence.

batch/verdict.py classifies a failed attempt (its class, the nodes to name and exclude); `blame`
names one culprit and says why, as the `attempt_verdict` row the supervisor records right after
`attempt_ended`: the first error line, the ranks whose hang stack is outside any collective while
the others wait in one, the ranks that reported nothing (missing heartbeats), the NCCL flight
recorder's ranks that never joined the collective the others waited in (cli/nccl_dumps.py), XID
and ECC text in a device error or a health-gate reason, and in the kernel log when the culprit is
the supervisor's own node (common/gpu_health.py). A configuration or user error (config_error,
oom, diverged, checkpoint_unreadable, setup_failed, or a crash every rank hit alike) blames no
node: "configuration/user". It reads the rows the supervisor holds and the attempt's hangs/ and
logs/ files (never Slurm; milliseconds), and never raises: a failure to judge is a low-confidence
row saying so.

Confidence is a word, not a number: no calibration data backs a decimal, and the one consumer
(exclusion) needs a threshold, not a score.
- high: direct evidence naming exactly one node: Slurm marked it down or its slurmd is
  unreachable; its own device error or health-gate failure; the only node whose ranks never joined
  the rendezvous; the flight recorder's only node behind; the only node whose ranks hung outside
  any collective (the others waited in one, or reported nothing). Only these exclude a node, and
  only for a node failure or a hang (batch/exclusions.py).
- medium: one candidate by elimination (the only rank with an error of its own while its peers
  saw theirs fail; the only ranks that reported nothing when the others reported a hang), or
  direct evidence naming several nodes (the first is the culprit).
- low: no rank stands out; the culprit, if any, is a guess.
"""

from __future__ import annotations

import pickle
import re
import socket
from dataclasses import dataclass, field
from typing import Optional, Sequence

from slurmtrain.batch.verdict import AttemptView, Verdict
from slurmtrain.cli import nccl_dumps
from slurmtrain.common import events, gpu_health, ledger
from slurmtrain.common.events import Confidence, FailureClass
from slurmtrain.common.rundir import RunDir

USER = "configuration/user"  # `no_culprit` of an error any node would repeat
# An error in what the user asked for: the same on any node, so never a node's fault.
USER_CLASSES = (
    FailureClass.config_error,
    FailureClass.oom,
    FailureClass.diverged,
    FailureClass.checkpoint_unreadable,
    FailureClass.setup_failed,
)
EVIDENCE_MAX = 8  # lines a row keeps (the row stays one small line; logs/ has the rest)
LINE_MAX = 300
# A frame of a collective (or of waiting for one) in a hang stack: the rank waits for its peers.
COLLECTIVE = re.compile(
    r"torch/distributed/|deepspeed/comm/|all_reduce|all_gather|reduce_scatter|broadcast|barrier|"
    r"\bwait\(|_allreduce|all_to_all"
)
ECC_TEXT = re.compile(r"\bECC\b|\bXid\b|uncorrectable|retired pages|remapped rows", re.IGNORECASE)


@dataclass
class Found:
    """What the rows say: the culprit (rank, node) or why none, how sure, and why."""

    confidence: Confidence
    rank: Optional[int] = None
    node: Optional[str] = None
    none: Optional[str] = None
    evidence: list[str] = field(default_factory=list)


def blame(run: RunDir, view: AttemptView, verdict: Verdict) -> events.AttemptVerdict:
    """The `attempt_verdict` row of a failed attempt the supervisor judged `verdict`."""
    try:
        found = judge(run, view, verdict)
    except Exception as err:  # noqa: BLE001  the restart must not wait on a bad guess
        found = Found(Confidence.low, none="unknown", evidence=[f"judging raised {err!r}"])
    return events.AttemptVerdict(
        cls=verdict.cls,
        culprit_rank=found.rank,
        culprit_node=found.node,
        no_culprit=found.none,
        confidence=found.confidence.value,
        evidence=tuple(" ".join(e.split())[:LINE_MAX] for e in found.evidence[:EVIDENCE_MAX]),
    )


def judge(run: RunDir, view: AttemptView, verdict: Verdict) -> Found:
    """The culprit of an attempt of class `verdict.cls` (see the module docstring)."""
    failed = [e for e in view.rows if isinstance(e, events.Failed)]
    first = first_error(failed, view.events)
    cls = verdict.cls
    if cls in USER_CLASSES:
        return Found(Confidence.high, none=USER, evidence=first)
    if cls in (FailureClass.timed_out, FailureClass.preempted, FailureClass.cancelled):
        return Found(Confidence.high, none=f"{cls}: no fault", evidence=first)
    if cls == FailureClass.node_failure:
        found = _node_failure(view, verdict, failed)
    elif cls == FailureClass.hang:
        found = _hang(run, view, verdict, failed)
    else:
        found = _crash(view, failed)
    found.evidence = first + found.evidence
    if cls == FailureClass.node_failure:
        found.evidence += local_xids(found.node)
    return found


def hosts_of(view: AttemptView) -> list[str]:
    """The attempt's node of each rank (index: rank), from its `started` row ([] before it)."""
    for e in reversed(view.events):
        if isinstance(e, events.Started) and view.attempt is not None and e.attempt == view.attempt:
            return list(e.hosts)
    return []


def _rank_on(node: str, hosts: Sequence[str]) -> Optional[int]:
    return next((r for r, h in enumerate(hosts) if h == node), None)


def _where(rank: Optional[int], hosts: Sequence[str]) -> str:
    node = hosts[rank] if rank is not None and 0 <= rank < len(hosts) else None
    return f"rank {rank}" + (f" ({node})" if node else "")


def first_error(failed: Sequence[events.Failed], rows: Sequence[events.Row]) -> list[str]:
    """`first error: rank 1 (n2): RuntimeError: ...`: the earliest row with a cause of its own
    (else the earliest failure), its last line: what a traceback ends with."""
    pick = ledger.real_errors(failed) or list(failed)
    if not pick:
        return []
    e = min(pick, key=lambda r: r.time)
    lines = (e.error or e.traceback or "").strip().splitlines()
    node = ledger.row_node(e, rows) or e.host
    where = f"rank {e.rank}" + (f" ({node})" if node else "") if e.rank is not None else node
    return [f"first error: {where or '?'}: {lines[-1] if lines else e.cls}"]


def _one(nodes: Sequence[str], hosts: Sequence[str], strong: bool, why: list[str]) -> Found:
    """The culprit among `nodes` named by evidence `why`: the first, high when it is the only one
    and the evidence `strong`, medium otherwise; low when none is named."""
    if not nodes:
        return Found(Confidence.low, none="unknown", evidence=why)
    node = nodes[0]
    sure = Confidence.high if strong and len(set(nodes)) == 1 else Confidence.medium
    if len(set(nodes)) > 1:
        why = why + [f"several nodes named: {', '.join(dict.fromkeys(nodes))}"]
    return Found(sure, _rank_on(node, hosts), node, evidence=why)


def _node_failure(view: AttemptView, verdict: Verdict, failed: list[events.Failed]) -> Found:
    """A node failure: the health gate's bad node, a rank's own device error, a chronic straggler
    rank 0 stopped the attempt to replace, or the node Slurm marked down or whose slurmd did not
    answer (verdict.nodes)."""
    hosts = hosts_of(view)
    bad = [e for e in view.rows if isinstance(e, events.BadNode) and e.node]
    if bad:
        why = [f"health gate: {e.node}: {e.reason}" for e in bad]
        return _one(
            [str(e.node) for e in bad], hosts, True, why + _ecc(e.reason or "" for e in bad)
        )
    device = [e for e in ledger.real_errors(failed) if ledger.is_device_error(e)]
    if device:
        nodes = [n for n in (ledger.row_node(e, view.events) for e in device) if n]
        why = [f"device error on {n}" for n in dict.fromkeys(nodes)]
        found = _one(nodes, hosts, True, why + _ecc(e.error + (e.traceback or "") for e in device))
        mine = [e.rank for e in device if ledger.row_node(e, view.events) == found.node]
        found.rank = next((r for r in mine if r is not None), found.rank)
        return found
    slow = [e for e in view.rows if isinstance(e, events.Straggler) and e.chronic and e.excluded]
    if slow and not verdict.nodes:  # rank 0 stopped the attempt for a spare to replace it
        e = slow[0]
        why = [
            f"chronic straggler: {e.node} at {e.factor}x the median rank for {e.windows} windows"
        ]
        found = _one([str(e.node)], hosts, True, why)
        found.rank = e.rank if e.rank is not None else found.rank
        return found
    why = [f"{n}: {verdict.exclude.get(n) or 'marked down by Slurm'}" for n in verdict.nodes]
    return _one(list(verdict.nodes), hosts, True, why)


def local_xids(node: Optional[str]) -> list[str]:
    """XIDs in this host's kernel log when `node` is this host (the batch shell runs on the
    job's first node): another node's log is not readable from here. One `dmesg`, 1 s at most."""
    if not node or node != socket.gethostname().split(".")[0]:
        return []
    return [f"kernel log: xid {x} at {pci}" for pci, x in gpu_health.xids(gpu_health.kernel_log())]


def _ecc(texts: object) -> list[str]:
    """`xid 79 at 0000:3b:00.0`, `ECC: ...`: the hardware error text in the rows' own words."""
    out: list[str] = []
    for text in texts:  # type: ignore[attr-defined]  # an iterable of str
        out += [f"xid {x} at {pci}" for pci, x in gpu_health.xids(str(text))]
        out += [line.strip() for line in str(text).splitlines() if ECC_TEXT.search(line)][:2]
    return list(dict.fromkeys(out))


def _hang(run: RunDir, view: AttemptView, verdict: Verdict, failed: list[events.Failed]) -> Found:
    """A hang: before `started`, the nodes the verdict named (stuck, or never joined the
    rendezvous); after, the ranks the flight recorder shows behind, else those whose stack is
    outside any collective while others wait in one, else those that reported nothing."""
    hosts = hosts_of(view)
    hung = sorted((e for e in failed if e.cls == FailureClass.hang), key=lambda e: e.time)
    # the first hang's own line, unless it is the first error (judge puts that first)
    why = [f"hang: {_where(e.rank, hosts)}: {e.error.strip()[:160]}" for e in hung[:1]]
    why = [w for w in why if w.split(": ", 1)[1] not in " ".join(first_error(failed, view.events))]
    if view.attempt is None:
        named = [f"{n}: {verdict.exclude.get(n) or 'hung before started'}" for n in verdict.nodes]
        return _one(list(verdict.nodes), hosts, True, why + named)
    reported = {e.rank for e in failed if e.rank is not None}
    silent = [r for r in range(len(hosts)) if r not in reported]
    if silent and reported:
        why.append(f"missing heartbeats: ranks {nccl_dumps.ranges(silent)} reported nothing")
    behind, line = _flight_recorder(run, view)
    if line:
        why.append(line)
    outside, waiting = _stacks(run, view.attempt, sorted(set(hosts)))
    if outside:
        others = f"; ranks {nccl_dumps.ranges(waiting)} wait in one" if waiting else ""
        why.append(f"stack outside any collective: ranks {nccl_dumps.ranges(outside)}{others}")
    # Outside a collective on every node: a shared cause (the filesystem), not one node's.
    alone = outside if {hosts[r] for r in outside if r < len(hosts)} != set(hosts) else []
    for ranks, strong in ((behind, True), (alone, True), ([] if outside else silent, False)):
        nodes = [hosts[r] for r in ranks if 0 <= r < len(hosts)]
        if nodes and reported:
            found = _one(nodes, hosts, strong, why)
            found.rank = min(r for r in ranks if r < len(hosts) and hosts[r] == found.node)
            return found
    return Found(Confidence.low, none="unknown", evidence=why + ["no rank stands out"])


def _flight_recorder(run: RunDir, view: AttemptView) -> tuple[list[int], str]:
    """(ranks behind, the line saying so) from the attempt's flight recorder dumps, if any."""
    started = next(
        (e for e in view.events if isinstance(e, events.Started) and e.attempt == view.attempt),
        None,
    )
    if started is None:
        return [], ""
    found = nccl_dumps.find(run.logs) if run.logs.is_dir() else {}
    key = f"{started.job_id}.{started.restart or 0}.{started.relaunch or 0}"
    if key not in found:
        return [], ""
    dumps: dict[int, nccl_dumps.Dump] = {}
    for rank, path in found[key].items():
        try:
            dumps[rank] = nccl_dumps.read(path)
        except (OSError, ValueError, pickle.UnpicklingError, EOFError):
            continue
    stalls = nccl_dumps.analyse(dumps, len(started.hosts) or None)
    behind = sorted({r for s in stalls for r in s.behind})
    return behind, f"flight recorder: {stalls[0].line()}" if stalls else ""


def _stacks(run: RunDir, attempt: int, nodes: Sequence[str]) -> tuple[list[int], list[int]]:
    """(ranks whose main thread hung outside any collective, ranks that waited in one) from the
    watchdog's stack dumps (hangs/attempt{A}.{node}.txt, one `==== rank R ====` block each: a hung
    rank's, or a `peer failure` one's whose collective failed when the hung rank exited)."""
    outside: list[int] = []
    waiting: list[int] = []
    for node in nodes:
        try:
            text = run.hang_dump(attempt, node).read_text(errors="replace")
        except OSError:
            continue
        for block in re.split(r"^==== rank (?=\d+ ====$)", text, flags=re.M)[1:]:
            head, _, body = block.partition(" ====\n")
            main = re.search(
                r"^Thread \d+ \(MainThread\):\n(.*?)(?=^Thread |\Z)", body, re.M | re.S
            )
            if not head.isdigit() or main is None:
                continue
            # a peer's failure ended its wait: the traceback heading the block is in a collective
            stuck = main.group(1) + body.split("\nThread ", 1)[0]
            (waiting if COLLECTIVE.search(stuck) else outside).append(int(head))
    return sorted(outside), sorted(waiting)


def _crash(view: AttemptView, failed: list[events.Failed]) -> Found:
    """A crash: every rank with an error of its own saying the same thing is the program or its
    configuration (no node); one rank with its own error while its peers saw theirs fail is the
    culprit rank (medium: a program error on one rank may be the data it read); no error of its
    own anywhere: the ranks that wrote nothing (a process killed)."""
    hosts = hosts_of(view)
    real = ledger.real_errors(failed)
    if real:
        said = {re.sub(r"\d+", "N", (e.error.strip().splitlines() or [""])[-1]) for e in real}
        ranks = sorted({e.rank for e in real if e.rank is not None})
        if len(said) == 1 and (len(ranks) > 1 or len(hosts) <= 1):
            every = len(ranks) >= len(hosts)
            why = [f"ranks {nccl_dumps.ranges(ranks)} raised the same error"]
            return Found(Confidence.high if every else Confidence.medium, none=USER, evidence=why)
        first = min(real, key=lambda e: e.time)
        node = ledger.row_node(first, view.events)
        why = [f"the only error of its own: {_where(first.rank, hosts)}"] if len(ranks) == 1 else []
        sure = Confidence.medium if len(ranks) == 1 else Confidence.low
        return Found(sure, first.rank, node, evidence=why or ["several ranks raised errors"])
    reported = {e.rank for e in failed if e.rank is not None}
    silent = [r for r in range(len(hosts)) if r not in reported]
    if reported and silent:
        why = [
            f"missing heartbeats: ranks {nccl_dumps.ranges(silent)} reported nothing; "
            f"ranks {nccl_dumps.ranges(reported)} saw a peer fail"
        ]
        return Found(
            Confidence.medium if len(silent) == 1 else Confidence.low,
            silent[0],
            hosts[silent[0]],
            evidence=why,
        )
    return Found(Confidence.low, none="unknown", evidence=["no rank stands out"])
