"""Megatron's checkpoint-I/O flags that its CI configurations pass almost everywhere, --finetune,
and --logging-level.

Names, destinations and defaults are Megatron 0.19.2's (its CheckpointConfig and LoggerConfig
fields become these flags there). Most of the checkpoint flags choose *who* reads or writes
which shard, or cache a plan between saves: the files and what a load puts in the model are the
same without them, so they are kept on ``args`` under Megatron's names and listed once in the
run's header as having no effect here (``args.no_effect_notes``). --finetune and --logging-level
change what the run does and are implemented. validate_ckpt_args is their part of validate_args:
torch-free, each refusal one line.
"""

from __future__ import annotations

import logging
import os

from minitron.training.argument_errors import require
from minitron.training.arguments_policy import note_no_effect
from minitron.training.arguments_ranges import COUNT, POSITIVE

# flag given -> why it changes nothing in minitron (the header's line). Keyed by dest, as read
# back from the parsed args; only flags whose non-default value is listed.
_FULLY_PARALLEL = ("spreads the {} of a torch_dist checkpoint's shards over the data-parallel ranks (each rank "
                   "{} a part and they exchange); which rank touches which file, not what the checkpoint holds")
_NO_EFFECT = {
    "ckpt_fully_parallel_save": (False, "--no-ckpt-fully-parallel-save",
                                 _FULLY_PARALLEL.format("writing", "writes") + ": minitron's writer is its own"),
    "ckpt_fully_parallel_save_deprecated": (True, "--ckpt-fully-parallel-save",
                                            "deprecated in Megatron too (parallel save is its default)"),
    "ckpt_fully_parallel_load": (True, "--ckpt-fully-parallel-load",
                                 _FULLY_PARALLEL.format("reading", "reads") + ": each minitron rank reads its own"),
    "ckpt_assume_constant_structure": (True, "--ckpt-assume-constant-structure",
                                       "caches the save and load plans between checkpoints of the same structure; "
                                       "the same files, planned again each time here"),
    "auto_detect_ckpt_format": (True, "--auto-detect-ckpt-format",
                                "minitron's --load always reads the format off the checkpoint (metadata.json), "
                                "as Megatron does with this flag"),
    "verify_integrity": (True, "--verify-integrity",
                         "minitron always writes each checkpoint file's sha256 into metadata.json and checks it "
                         "before a load"),
}


def add_ckpt_args(parser) -> None:
    g = parser.add_argument_group("checkpoint I/O and logging level (Megatron's CheckpointConfig, LoggerConfig)")
    g.add_argument("--no-ckpt-fully-parallel-save", dest="ckpt_fully_parallel_save", action="store_false",
                   help="(no effect here) write torch_dist shards without spreading them over data-parallel ranks")
    g.add_argument("--ckpt-fully-parallel-save", dest="ckpt_fully_parallel_save_deprecated", action="store_true",
                   help="(no effect here; deprecated in Megatron) parallel save is the default")
    g.add_argument("--ckpt-fully-parallel-load", action="store_true",
                   help="(no effect here) read torch_dist shards spread over data-parallel ranks, then exchange")
    g.add_argument("--ckpt-assume-constant-structure", action="store_true",
                   help="(no effect here) cache the checkpoint's save/load plan between checkpoints")
    g.add_argument("--auto-detect-ckpt-format", action="store_true",
                   help="(what minitron always does) read the format of --load's checkpoint off the checkpoint")
    g.add_argument("--verify-integrity", action="store_true",
                   help="(what minitron always does) sha256 of every file at save, checked before a load; "
                        "torch_dist only, as Megatron")
    g.add_argument("--finetune", action="store_true",
                   help="--load the weights only: no optimizer, schedule or random states, and the run starts at "
                        "iteration 0 with no samples consumed")
    g.add_argument("--save-retain-interval", type=POSITIVE, default=None, metavar="N",
                   help="keep the latest checkpoint and those of iterations divisible by N: each save removes "
                        "the one before it otherwise (after the new one is whole)")
    g.add_argument("--logging-level", type=COUNT, default=None, metavar="LEVEL",
                   help="the root Python logger's level on every rank (10 DEBUG, 20 INFO, 30 WARNING, ...); "
                        "unset: MEGATRON_LOGGING_LEVEL if set")


def validate_ckpt_args(args) -> None:
    require(args.ckpt_format != "fsdp_dtensor" or getattr(args, "use_megatron_fsdp", False),
            "--ckpt-format fsdp_dtensor is Megatron-FSDP's checkpoint (its shards by parameter, through torch's "
            "DCP): add --use-megatron-fsdp, or use torch_dist (Megatron's default)")
    require(not (args.verify_integrity and args.ckpt_format != "torch_dist"),
            f"--verify-integrity is for --ckpt-format torch_dist (Megatron's rule), got {args.ckpt_format}")
    require(not (args.save_retain_interval and getattr(args, "deepspeed", False)),
            "--save-retain-interval removes Megatron's iter_* checkpoints; a --deepspeed engine saves its own "
            "layout: drop one of them")
    if args.finetune:
        require(not getattr(args, "deepspeed", False),
                "--finetune reads Megatron's checkpoint layout; a --deepspeed engine loads its own: drop one")
        # As Megatron's load_checkpoint: a finetuned run reads neither the optimizer (its moments,
        # its schedule) nor the random states, and counts from iteration 0 (checkpointing.py).
        args.no_load_optim = True
        args.no_load_rng = True
    notes = [f"{flag}: {why}" for dest, (given, flag, why) in _NO_EFFECT.items() if getattr(args, dest) == given]
    note_no_effect(args, *notes)


def setup_logging(args) -> None:
    """Megatron's initialize.setup_logging: --logging-level, else MEGATRON_LOGGING_LEVEL, sets the
    root logger's level (what torch's and the libraries' loggers defer to); neither: untouched."""
    level = os.environ.get("MEGATRON_LOGGING_LEVEL")
    level = args.logging_level if getattr(args, "logging_level", None) is not None else level
    if level is not None:
        logging.getLogger().setLevel(int(level))
