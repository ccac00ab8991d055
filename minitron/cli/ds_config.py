"""`minitron ds-config`: resolve a DeepSpeed config as DeepSpeed would, without starting anything."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from minitron.cli.common import UserError, app, console

TRIAD_RULE = "train_batch_size = micro batch per GPU × accumulation steps × data-parallel size"


@app.command("ds-config")
def ds_config(
    file: Path = typer.Argument(..., help="the ds_config JSON file"),
    data_parallel_size: int = typer.Option(1, "--data-parallel-size", "--dp",
                                           help="data-parallel ranks (DeepSpeed's 'world size' when an mpu is given)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object with every resolved value"),
):
    """Resolve a DeepSpeed config (the batch triad and every section) as deepspeed.initialize would."""
    # Lazy: only this command reads a ds_config; `minitron --help` and the others skip runtime/.
    from minitron.runtime import DeepSpeedConfig, DeepSpeedConfigError

    try:
        config = DeepSpeedConfig(file, world_size=data_parallel_size)
    except DeepSpeedConfigError as exc:
        raise UserError(str(exc)) from None
    resolved = config.as_dict()
    if as_json:
        print(json.dumps(resolved))
        return
    given = config._param_dict
    table = Table(title=f"batch triad at data-parallel size {config.world_size}", title_justify="left")
    table.add_column("key")
    table.add_column("value", justify="right")
    table.add_column("")
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        table.add_row(key, str(resolved[key]), "given" if given.get(key) is not None else "derived")
    console.print(table)
    console.print(f"{TRIAD_RULE}\n{'':<14}{config.train_batch_size:>2} = {config.train_micro_batch_size_per_gpu} × "
                  f"{config.gradient_accumulation_steps} × {config.world_size}", highlight=False)
    precision = "fp16" if config.fp16_enabled else "bf16" if config.bfloat16_enabled else "fp32"
    scale = ("dynamic loss scale from 2^{:g}".format(__import__("math").log2(config.initial_dynamic_scale))
             if config.fp16_enabled and config.loss_scale == 0 else f"loss scale {config.loss_scale:g}")
    console.print(f"precision {precision}" + (f" ({scale})" if config.fp16_enabled else ""))
    for key, why in resolved["no_effect"].items():   # accepted keys that change nothing in minitron's engine
        console.print(f"{key}: accepted, changes nothing here: {why}", highlight=False)
    zero = config.zero_config
    console.print(f"ZeRO stage {zero.stage}; gradient clipping {config.gradient_clipping:g}; optimizer "
                  f"{config.optimizer_name or '(the program’s own)'}; scheduler {config.scheduler_name or 'none'}")
    if zero.stage > 0:
        # overlap_comm's default depends on the stage (on at 3 only): say what it resolved to.
        console.print(f"overlap_comm {str(zero.overlap_comm).lower()}; reduce_bucket_size {zero.reduce_bucket_size:,}")
        # ZeRO-Offload (zero/offload_config.py): where the optimizer's states and the pieces live
        for key in ("offload_optimizer", "offload_param"):
            section = getattr(zero, key)
            if section is not None and section.device != "none":
                where = f"{section.device}" + (f" ({section.nvme_path})" if section.device == "nvme" else "")
                console.print(f"{key} {where}; pin_memory {str(section.pin_memory).lower()}", highlight=False)
