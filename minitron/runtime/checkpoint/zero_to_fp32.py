#!/usr/bin/env python
"""Whole fp32 weights from a ZeRO 1-3 checkpoint in DeepSpeed's layout, with nothing but torch:
no model, no ranks. The engine copies this file beside its checkpoints, where DeepSpeed copies
its own ``zero_to_fp32.py`` (which reads minitron's checkpoints too; the tests hold the two to
the same weights).

    python zero_to_fp32.py CHECKPOINT_DIR OUTPUT_FILE [--tag global_step3]

How the pieces fit (rank 0's model-states file says where each parameter goes):

    stages 1-2   each group's lean fp32 partitions, rank after rank, are the group's parameters
                 end to end, in ``param_shapes`` order
    stage 3      each parameter is cut on its own into ceil(numel / dp) elements per rank;
                 rank r's file holds its pieces of every parameter end to end, so parameter k is
                 the same run of elements in every rank's file, and the runs glued in rank order,
                 the padding cut off, are the parameter
"""

import argparse
import math
import os
import re
import sys

import pickle
import types

import torch


class _Unpickler(pickle.Unpickler):
    """The optimizer files hold DeepSpeed's own loss-scaler object, which a plain load would
    import DeepSpeed to rebuild. This script reads only tensors and counts, so any ``deepspeed.*``
    class becomes an empty stand-in, and the script runs where DeepSpeed is not installed."""

    def find_class(self, module, name):
        if module == "deepspeed" or module.startswith("deepspeed."):
            return type(name, (), {"__init__": lambda self, *args: None, "__setstate__": lambda self, state: None})
        return super().find_class(module, name)


# What torch.load asks of its pickle_module: an Unpickler and a load.
_PICKLE = types.SimpleNamespace(Unpickler=_Unpickler, load=pickle.load, __name__="pickle")


def _natural(name: str) -> list:
    """zero_pp_rank_10 after zero_pp_rank_9, not after zero_pp_rank_1."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _load_all(directory: str, suffix: str) -> list:
    # Tensor-parallel rank 0's files only: each tensor rank holds a different slice.
    names = sorted((n for n in os.listdir(directory) if n.endswith("mp_rank_00" + suffix)), key=_natural)
    if not names:
        raise FileNotFoundError(f"no *mp_rank_00{suffix} in {directory}: give the folder that holds 'latest' "
                                "and the tags of a ZeRO 1-3 checkpoint")
    return [torch.load(os.path.join(directory, n), map_location="cpu", weights_only=False, pickle_module=_PICKLE)
            for n in names]


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir: str, tag: str | None = None) -> dict:
    if tag is None:
        with open(os.path.join(checkpoint_dir, "latest")) as latest:
            tag = latest.read().strip()
    directory = os.path.join(checkpoint_dir, tag)
    model = _load_all(directory, "_model_states.pt")[0]
    optim = [f["optimizer_state_dict"] for f in _load_all(directory, "_optim_states.pt")]
    stage, dp = int(optim[0]["zero_stage"]), len(optim)
    state = {n: t.float() if t.is_floating_point() else t
             for n, t in model["module"].items() if n in model["buffer_names"]}
    if stage <= 2:
        state.update(model.get("frozen_param_fragments") or {})   # whole on every rank
        for g, shapes in enumerate(model["param_shapes"]):
            flat, offset = torch.cat([o["single_partition_of_fp32_groups"][g] for o in optim]), 0
            for name, shape in shapes.items():
                numel = math.prod(shape)
                state[name] = flat[offset:offset + numel].view(shape).clone()
                offset += numel
    else:
        flats, offset = [torch.cat(list(o["fp32_flat_groups"])) for o in optim], 0
        for shapes in model["param_shapes"]:
            for name, shape in shapes.items():
                numel = math.prod(shape)
                piece = -(-numel // dp)
                state[name] = torch.cat([f[offset:offset + piece] for f in flats])[:numel].view(shape).clone()
                offset += piece
    for alias, name in model["shared_params"].items():   # tied weights were stored once
        state[alias] = state[name]
    return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint_dir", help="the folder holding 'latest' and the tags")
    parser.add_argument("output_file", help="where to torch.save the fp32 state dict")
    parser.add_argument("--tag", default=None, help="a tag folder; default: the one 'latest' names")
    args = parser.parse_args()
    try:
        state = get_fp32_state_dict_from_zero_checkpoint(args.checkpoint_dir, args.tag)
    except FileNotFoundError as missing:   # one line, as for any bad input, and exit code 2
        print(f"zero_to_fp32.py: {missing}", file=sys.stderr)
        sys.exit(2)
    torch.save(state, args.output_file)


if __name__ == "__main__":
    main()
