"""Param, the accountant's record of one parameter tensor, and its reader of optional flags.

Below theoretical_params.py and theoretical_mamba.py, which both list parameters: the GPT's
lists ask theoretical_mamba for a Mamba layer's, so neither can import the other for these.
theoretical_params re-exports both.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Param:
    name: str
    numel: int
    shared_embedding: bool = False   # the tied matrix on a pipeline stage (its own DDP bucket)
    sequence_parallel: bool = False  # replicated and seeing part of the sequence: summed over tp
    expert: bool = False             # an MoE expert's: a buffer of its own over the expert-dp group
    row: int = 1                     # elements per row (shape[1:]): Megatron-FSDP keeps rows whole


def _flag(args, name, default=None):
    return getattr(args, name, default)
