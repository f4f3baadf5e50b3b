"""Checkpoints written by a Python that pickles enums by name still load weights-only.

Python 3.11.2 (Debian 12's, the container image's) pickles DeepSpeed's ZeroStageEnum as
`getattr(ZeroStageEnum, "gradients")` (so do 3.12+), where 3.11.7 writes `ZeroStageEnum(2)`:
found when the container run's resume refused every checkpoint (tests/cluster/test_containers.py).
The allow-list maps `builtins.getattr` to a member lookup on allow-listed enums only.
"""

from __future__ import annotations

import pickle

import pytest
import torch
from deepspeed.runtime.zero.config import ZeroStageEnum

from slurmtrain.compute.checkpoint import safe_load


class _ByName:
    """Pickles as 3.11.2/3.12+ pickle an enum member: getattr(cls, name)."""

    def __init__(self, cls, name):
        self.cls, self.name = cls, name

    def __reduce__(self):
        return getattr, (self.cls, self.name)


def test_an_enum_pickled_by_name_loads(tmp_path):
    path = tmp_path / "optim_states.pt"
    torch.save({"zero_stage": _ByName(ZeroStageEnum, "gradients")}, path)
    assert safe_load.load(path)["zero_stage"] is ZeroStageEnum.gradients


def test_getattr_on_anything_else_is_still_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"x": _ByName(torch.Tensor, "__init__")}, path)
    with pytest.raises(pickle.UnpicklingError):
        safe_load.load(path)
