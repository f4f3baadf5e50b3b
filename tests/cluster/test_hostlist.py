"""Our hostlist expand/compress agree with Slurm's own (`scontrol show hostnames/hostlist`).

Generated lists have zero padding, several bracket groups, text between groups, comma lists inside
and between brackets, duplicates, and up to 4096 hosts.
"""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmtrain.common.slurm_text import compress_hostlist, expand_hostlist

pytestmark = pytest.mark.slurm
MAX_HOSTS = 4096
SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

words = st.text("abcgnoprux", min_size=1, max_size=4)
infix = st.text("abn-_.0123456789", min_size=0, max_size=3)


@st.composite
def ranges(draw, budget: int) -> tuple[str, int]:
    """One bracket body like `001-012,7` holding at most `budget` hosts."""
    parts, count = [], 0
    for _ in range(draw(st.integers(1, 3))):
        if count >= budget:
            break
        lo = draw(st.integers(0, 1200))
        n = draw(st.integers(1, max(1, min(budget - count, 300))))
        width = draw(st.sampled_from([0, 0, 2, 3, 4]))
        lo_s = f"{lo:0{width}d}"
        parts.append(lo_s if n == 1 else f"{lo_s}-{lo + n - 1:0{len(lo_s)}d}")
        count += n
    return ",".join(parts), count


@st.composite
def items(draw, budget: int) -> tuple[str, int]:
    """`pre[ranges]mid[ranges]...`; Slurm 22.05 allows no text after the last bracket."""
    brackets = draw(st.integers(0, 3))
    text, total = draw(words), 1
    if brackets == 0:
        return text + draw(st.sampled_from(["", "1", "007", "12"])), 1
    for i in range(brackets):
        body, n = draw(ranges(max(1, budget // total)))
        text += f"[{body}]" + (draw(infix) if i < brackets - 1 else "")
        total *= n
    return text, total


@st.composite
def hostlists(draw) -> str:
    out, total = [], 0
    for _ in range(draw(st.integers(1, 4))):
        if total >= MAX_HOSTS:
            break
        item, n = draw(items(MAX_HOSTS - total))
        if total + n > MAX_HOSTS:
            continue
        out.append(item)
        total += n
    return ",".join(out or ["n1"])


def scontrol(what: str, arg: str) -> str:
    res = subprocess.run(
        ["scontrol", "show", what, arg], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, f"scontrol show {what} {arg!r}: {res.stderr}"
    return res.stdout


@SETTINGS
@given(hostlists())
def test_expand_equals_scontrol_show_hostnames(slurm_cluster, text):
    assert expand_hostlist(text) == scontrol("hostnames", text).split()


@SETTINGS
@given(hostlists(), st.randoms(use_true_random=False))
def test_compress_round_trips_and_matches_scontrol_show_hostlist(slurm_cluster, text, rnd):
    hosts = expand_hostlist(text)
    if rnd.random() < 0.3:  # unordered lists and duplicates too
        hosts = rnd.sample(hosts, k=len(hosts)) + hosts[: rnd.randint(0, 3)]
    ours = compress_hostlist(hosts)
    assert expand_hostlist(ours) == hosts
    theirs = scontrol("hostlist", ",".join(hosts)).strip()
    assert expand_hostlist(theirs) == hosts
    assert ours == theirs
