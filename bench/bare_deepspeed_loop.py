"""A really bare DeepSpeed loop: transformers' OPT, a DeepSpeed config written here, DeepSpeed's loop.

    python bench/bare_deepspeed_loop.py '{"num_layers": 24, "hidden_size": 2048, ...}' \\
        --micro 8 --seq 2048 --warmup 10 --steps 20 [--dtype bf16|fp32]

What a DeepSpeed user writes for this model, and nothing of slurmtrain's (it imports no slurmtrain
module): OPTForCausalLM from an OPTConfig of the given shapes (SDPA attention, dropout off),
built on the device in the training dtype; transformers' own shifted-label loss
(`labels=input_ids`); the DeepSpeed config dict below; and `engine(...)`, `engine.backward`,
`engine.step`. The config asks for what slurmtrain's run asks DeepSpeed for (ZeRO-2 with
overlapped, contiguous one-layer buckets; bf16 with fp32 gradient accumulation and reduction;
torch's fused AdamW; clipping at 1.0), so a ratio against it is about the training stack around
DeepSpeed, not about different knobs. Batches are random token ids, copied to the device each step.

Started once per rank with RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT set (NCCL on a GPU,
gloo with DS_ACCELERATOR=cpu). Rank 0 prints one JSON line: tokens/s over steps WARMUP+1 to
WARMUP+STEPS (the device synchronised at both ends), their seconds, the peak memory and the
settings.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any, NotRequired, TypedDict


class Result(TypedDict):
    """Rank 0's JSON line."""

    tokens_per_s: float
    seconds_timed: float
    steps_timed: int
    final_loss: float
    settings: dict[str, Any]
    peak_mem_bytes: NotRequired[int]  # GPU runs


def ds_config(micro: int, hidden: int, bf16: bool, fused: bool) -> dict[str, Any]:
    """The DeepSpeed config: ZeRO-2, one layer's gradients per bucket (12 h^2 elements)."""
    bucket = max(12 * hidden * hidden, 20_000_000)
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {
            "stage": 2,
            "overlap_comm": True,
            "contiguous_gradients": True,
            "reduce_bucket_size": bucket,
            "allgather_bucket_size": bucket,
        },
        "bf16": {"enabled": bf16},
        "gradient_clipping": 1.0,
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": 1e-4,
                "betas": [0.9, 0.95],
                "eps": 1e-8,
                "weight_decay": 0.1,
                "torch_adam": True,
                "fused": fused,
            },
        },
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if bf16:  # 16-bit weights, gradients accumulated and reduced in fp32
        config.update(communication_data_type="fp32", data_types={"grad_accum_dtype": "fp32"})
    return config


def build_model(shape: dict[str, Any], device: Any, dtype: Any) -> Any:
    """OPTForCausalLM of these shapes, allocated and initialised on `device` in `dtype`."""
    import torch
    from transformers import OPTConfig, OPTForCausalLM

    config = OPTConfig(
        vocab_size=shape["vocab_size"],
        hidden_size=shape["hidden_size"],
        num_hidden_layers=shape["num_layers"],
        ffn_dim=shape["ffn_dim"],
        num_attention_heads=shape["num_heads"],
        max_position_embeddings=shape["max_positions"],
        word_embed_proj_dim=shape.get("word_embed_proj_dim") or shape["hidden_size"],
        do_layer_norm_before=shape.get("layer_norm_before", True),
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        layerdrop=0.0,
        use_cache=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(1234)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return OPTForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", help="the model's shapes, JSON (keys of conf/model/*.yaml)")
    parser.add_argument("--micro", type=int, required=True)
    parser.add_argument("--seq", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    args = parser.parse_args()
    shape = json.loads(args.shape)
    import deepspeed
    import torch
    import torch.distributed as dist

    gpu = torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR") != "cpu"
    if gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    else:  # DeepSpeed's shared-memory all-reduce would JIT-compile for ~50 s first
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="nccl" if gpu else "gloo", verbose=False)
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    bf16 = args.dtype == "bf16"
    model = build_model(shape, device, torch.bfloat16 if bf16 else torch.float32)
    config = ds_config(args.micro, shape["hidden_size"], bf16, fused=gpu)
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    total = args.warmup + args.steps
    g = torch.Generator().manual_seed(dist.get_rank())
    batches = [
        torch.randint(0, shape["vocab_size"], (args.micro, args.seq), generator=g)
        for _ in range(total)
    ]
    if gpu:
        batches = [b.pin_memory() for b in batches]
    started = 0.0
    for step in range(total):
        if step == args.warmup:
            sync()
            started = time.perf_counter()
        ids = batches[step].to(device, non_blocking=True)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
    sync()
    elapsed = time.perf_counter() - started
    if dist.get_rank() == 0:
        world = dist.get_world_size()
        out: Result = {
            "tokens_per_s": args.steps * args.micro * args.seq * world / elapsed,
            "seconds_timed": elapsed,
            "steps_timed": args.steps,
            "final_loss": float(loss.detach().float().item()),
            "settings": {
                "micro_batch": args.micro,
                "seq_len": args.seq,
                "world": world,
                "dtype": args.dtype,
                "zero_stage": config["zero_optimization"]["stage"],
            },
        }
        if gpu:
            out["peak_mem_bytes"] = int(torch.cuda.max_memory_allocated(device))
        print(json.dumps(out), flush=True)
    engine.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
