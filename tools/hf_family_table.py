"""Every family transformers ships as a causal LM, through slurmtrain's login checks: trains or refused.

    .venv/bin/python tools/hf_family_table.py [--build] [FAMILY ...]

Each family's tiny config is written by its own config class (tests/local/test_hf_families.py
`tiny_config`), read as `model=hf model.config=DIR` reads it (hf_config.model_keys), its attention
resolved (model.attn_implementation=auto) and, with --build, built on CPU from the config as the
compute side builds it and run one forward and backward pass. Prints one markdown row a family:
what `model=hf` does with it (trains, or the one-line refusal the user sees).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def row(family: str, folder: Path, build: bool) -> str:
    from slurmtrain.common import hf_config
    from slurmtrain.common.errors import ConfigError

    tests = importlib.import_module("tests.local.test_hf_families")  # its tiny_config factory
    tiny_config, SEQ_LEN = tests.tiny_config, int(tests.SEQ_LEN)

    try:
        tiny_config(family, folder)
    except Exception as err:  # the class cannot even write a small config of itself
        text = " ".join(str(err).split())[:120]
        return f"| {family} | refused | transformers cannot write a small config ({text}) |"
    try:
        data = hf_config.read(str(folder))
        keys = hf_config.model_keys(data, seq_len=SEQ_LEN)
        model = {**keys, "config": str(folder / "config.json"), "attn_implementation": "auto"}
        attn = hf_config.attention(model)
        if build:
            _step(model, attn)
    except ConfigError as err:
        return f"| {family} | refused | {err} |"
    except Exception as err:
        text = " ".join(f"{type(err).__name__}: {err}".split())[:160]
        return f"| {family} | refused | transformers cannot build or run it ({text}) |"
    return f"| {family} | trains | attention {attn} |"


def _step(model: dict[str, object], attn: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from slurmtrain.common.hf_config import family_config

    net = AutoModelForCausalLM.from_config(family_config(model, attn))
    batch = torch.randint(0, 256, (2, 17))
    net(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss.backward()


def main(argv: list[str]) -> int:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    build = "--build" in argv
    families = [a for a in argv if not a.startswith("--")] or sorted(
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    )
    print("| family | model=hf | why / attention |\n|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for family in families:
            print(row(family, Path(tmp) / family, build), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    sys.exit(main(sys.argv[1:]))
