"""Every random generator a step may draw from: saved with each checkpoint, restored on load."""

from __future__ import annotations

from typing import Any


def rng_state() -> dict[str, Any]:
    """Every generator a step may draw from (dropout, sampling): saved with each checkpoint."""
    import random

    import numpy as np
    import torch

    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import random

    import numpy as np
    import torch

    if state:
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state(state["cuda"])
