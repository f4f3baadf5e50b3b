"""Every random generator a step may draw from: saved with each checkpoint, restored on load."""

from __future__ import annotations

from typing import TYPE_CHECKING, NotRequired, Optional, TypedDict

if TYPE_CHECKING:
    import numpy as np
    import torch


class RngState(TypedDict):
    python: tuple[object, ...]  # random.getstate()
    numpy: tuple[str, np.ndarray, int, int, float] | dict[str, object]  # np.random.get_state()
    torch: torch.Tensor
    cuda: NotRequired[torch.Tensor]


def rng_state() -> RngState:
    """Every generator a step may draw from (dropout, sampling): saved with each checkpoint."""
    import random

    import numpy as np
    import torch

    state: RngState = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: Optional[RngState]) -> None:
    """Restore every generator (nothing when the checkpoint's RNG state was not loaded)."""
    import random

    import numpy as np
    import torch

    if state:
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state(state["cuda"])
