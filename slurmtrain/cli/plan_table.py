"""`slurmtrain plan-table`: the cheapest fitting DeepSpeed setting per OPT size and
node count, so a user can pick a size and a node count before writing any config."""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from slurmtrain.common.ds_config import bucket_elements  # the buckets slurmtrain trains with
from slurmtrain.common.errors import ConfigError
from slurmtrain.planning.memory import OPT_SIZES, GiB, param_count, recommend


def _nodes(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"--nodes={text!r}: use positive counts like 1,8,64")
    return values


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slurmtrain plan-table",
        description=__doc__,
        epilog="example: slurmtrain plan-table --nodes 1,8 --seq 4096 --markdown",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--gpu-mem-gb",
        type=float,
        default=79.1,
        help="GPU memory in GiB as the card reports it (default 79.1: an H100 80GB)",
    )
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--nodes", type=_nodes, default=[1, 8, 64], help="comma list (default 1,8,64)")
    p.add_argument("--seq", type=int, default=2048, help="sequence length (default 2048)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--max-micro-batch", type=int, default=16)
    p.add_argument(
        "--cpu-mem-gb",
        type=float,
        default=None,
        help="host memory per node, GiB; offload settings must fit it too",
    )
    p.add_argument(
        "--attention",
        choices=("sdpa", "eager"),
        default="sdpa",
        help="eager keeps the s^2 attention scores (Korthikanti's 5as/h term)",
    )
    p.add_argument("--markdown", action="store_true", help="plain markdown instead of a rich table")
    return p


def rows(args: argparse.Namespace) -> list[list[str]]:
    """One row per OPT size: name, params, then 'setting, GiB/GPU' per node count."""
    gpu = int(args.gpu_mem_gb * GiB)
    cpu: Optional[int] = int(args.cpu_mem_gb * GiB) if args.cpu_mem_gb else None
    out = []
    for name, model in OPT_SIZES.items():
        row = [name, f"{param_count(model) / 1e9:.2f}B"]
        for nodes in args.nodes:
            rec = recommend(
                model,
                nodes=nodes,
                gpus_per_node=args.gpus_per_node,
                gpu_mem_bytes=gpu,
                seq_len=args.seq,
                dtype=args.dtype,
                max_micro_batch=args.max_micro_batch,
                cpu_mem_bytes_per_node=cpu,
                attention=args.attention,
                reduce_bucket=bucket_elements(model.hidden_size),
                overlap_comm=True,
            )
            if rec is None:
                row.append("does not fit")
                continue
            cell = f"{rec.setting.label()}, {rec.plan.total / GiB:.1f} GiB"
            if rec.setting.offload_optimizer:
                cell += f" (host {rec.plan.cpu_per_node / GiB:.0f} GiB/node)"
            row.append(cell)
        out.append(row)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        table = rows(args)
    except ConfigError as err:
        print(f"plan_table: error: {err}", file=sys.stderr)
        return 2
    header = ["model", "params"] + [f"{n} x {args.gpus_per_node} GPUs" for n in args.nodes]
    title = (
        f"cheapest fitting setting per GPU of {args.gpu_mem_gb:g} GiB, seq {args.seq}, "
        f"{args.dtype}, attention {args.attention}"
    )
    if args.markdown:
        print(f"{title}\n")
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join("---" for _ in header) + "|")
        for row in table:
            print("| " + " | ".join(row) + " |")
        return 0
    from rich.console import Console
    from rich.table import Table

    rich_table = Table(title=title)
    for col in header:
        rich_table.add_column(col)
    for row in table:
        rich_table.add_row(*row)
    Console().print(rich_table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
