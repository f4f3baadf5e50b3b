"""Saves under ZeRO-1/2 leave the module weights to the partitions (module_states.py), and the shard
writer hashes while it writes: the checksum and the file are still exactly torch.save's bytes."""

from __future__ import annotations

import os
import types
import zlib
from collections import OrderedDict

import pytest
import torch

from slurmtrain.compute.checkpoint import module_states, writer
from slurmtrain.compute.checkpoint.module_states import OMITTED, strip


def _model_states(stage: int, **zero) -> dict:
    module = OrderedDict(
        [
            ("embed.weight", torch.ones(4, 3)),
            ("head.weight", torch.ones(4, 3)),  # tied to embed.weight
            ("norm.running_mean", torch.zeros(3)),  # a buffer
            ("frozen.weight", torch.full((2,), 7.0)),  # not in the optimizer
            ("layer.weight", torch.ones(3, 3)),
        ]
    )
    module._metadata = {"": {"version": 1}}
    return {
        "module": module,
        "buffer_names": ["norm.running_mean"],
        "param_shapes": [OrderedDict([("embed.weight", (4, 3)), ("layer.weight", (3, 3))])],
        "shared_params": {"head.weight": "embed.weight"},
        "frozen_param_fragments": {"frozen.weight": torch.full((2,), 7.0)},
        "ds_config": {"zero_optimization": {"stage": stage, **zero}},
        "global_steps": 5,
    }


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_1_2_model_states_keep_buffers_frozen_and_metadata_only(stage):
    state = _model_states(stage)
    out = strip(state, "/x/step_4.tmp/mp_rank_00_model_states.pt")
    assert list(out["module"]) == ["norm.running_mean", "frozen.weight"]
    assert out["module"]._metadata == {"": {"version": 1}}
    assert out[OMITTED] == ["embed.weight", "head.weight", "layer.weight"]
    assert out["global_steps"] == 5 and out["param_shapes"] is state["param_shapes"]
    assert len(state["module"]) == 5 and OMITTED not in state  # the engine's dict is untouched


@pytest.mark.parametrize(
    "state, path",
    [
        (_model_states(0), "mp_rank_00_model_states.pt"),  # no partitions
        (_model_states(3), "mp_rank_00_model_states.pt"),  # already sharded
        (_model_states(2, load_from_fp32_weights=False), "mp_rank_00_model_states.pt"),
        ({**_model_states(2), "param_shapes": None}, "mp_rank_00_model_states.pt"),
        (_model_states(2), "zero_pp_rank_0_mp_rank_00_optim_states.pt"),
        ({**_model_states(2), "ds_config": "ds.json"}, "mp_rank_00_model_states.pt"),
    ],
)
def test_everything_else_is_saved_as_it_is(state, path):
    assert strip(state, path) is state


def test_a_stripped_file_is_refused_where_the_partitions_are_not_loaded():
    """The module load `module_states.load` hands DeepSpeed (its custom_load_fn): trainable
    weights may be missing only where the ZeRO-1/2 fp32 partitions restore them."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("0.")}

    def engine(stage, fp32=True):
        return types.SimpleNamespace(
            zero_optimization_stage=lambda: stage, zero_load_from_fp32_weights=lambda: fp32
        )

    assert module_states._module(engine(2), state, model) == {"missing": {"0.weight", "0.bias"}}
    for refused in (engine(0), engine(3), engine(2, fp32=False)):
        with pytest.raises(RuntimeError, match="only in the ZeRO-1/2 fp32 partitions"):
            module_states._module(refused, state, model)
    del state["1.running_mean"]  # a buffer: the partitions do not hold it
    with pytest.raises(RuntimeError, match=r"missing keys \['1.running_mean'\]"):
        module_states._module(engine(2), state, model)


def test_hashing_while_writing_gives_the_files_crc_and_a_torch_load_file(tmp_path):
    big = torch.arange(3 * writer._CHUNK // 4 + 12345, dtype=torch.float32)  # > 3 chunks
    state = {"big": big, "small": torch.ones(7), "view": big[10:20], "meta": {"k": [1, 2]}}
    shard = writer.ShardWriter(True, "checksum")
    shard.begin(3, str(tmp_path), deferred=False)
    path = str(tmp_path / "s.pt")
    shard._write(state, path)
    entry = shard.report(0)["files"]["s.pt"]
    data = (tmp_path / "s.pt").read_bytes()
    assert entry["size"] == len(data) and entry["crc32"] == f"{zlib.crc32(data):08x}"
    back = torch.load(path, weights_only=False)
    assert torch.equal(back["big"], big) and torch.equal(back["view"], big[10:20])
    assert back["view"].untyped_storage().data_ptr() == back["big"].untyped_storage().data_ptr()
    assert set(shard.seconds) >= {"serialize", "write", "disk_wait", "hash", "fsync"}


def test_a_record_is_hashed_before_write_returns(tmp_path):
    """torch frees a GPU storage's host copy after write_record: nothing may be hashed later."""
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    sink = writer._RawFile(fd, hashing=True)
    record = bytearray(os.urandom(2 * writer._CHUNK + 5))
    want = zlib.crc32(record)
    sink.write(record)
    record[:] = bytes(len(record))  # the memory is reused at once
    sink.write(b"tail")
    sink.close()
    os.close(fd)
    assert sink.checksum.hexdigest() == f"{zlib.crc32(b'tail', want):08x}"
