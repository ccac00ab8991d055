"""DeepSpeed's universal checkpoint (``deepspeed/checkpoint/ds_to_universal.py``): a ZeRO 1-3
checkpoint, cut into one partition per data-parallel rank, becomes one folder per parameter
that holds the parameter whole, in fp32, with Adam's two moments beside it.

    python -m minitron.runtime.checkpoint.ds_to_universal \\
        --input_folder CKPT/global_step2 --output_folder UNI/global_step2

    UNI/latest_universal                       names the output folder (written beside it)
    UNI/global_step2/*_model_states.pt         copied: counters, schedule, client state
    UNI/global_step2/zero/optimizer_state.pt   what is not per parameter: loss scaler, param groups
    UNI/global_step2/zero/<name>/fp32.pt       the master weight, whole
    UNI/global_step2/zero/<name>/exp_avg.pt, exp_avg_sq.pt   Adam's moments, whole
    UNI/global_step2/zero/<name>/step.pt       Adam's step count (stages 1-2 only)

Nothing left in it depends on how many ranks wrote it or at which stage, so a run of any
data-parallel size and any stage cuts its own partitions out of the whole tensors
(universal_checkpoint.py). That is the point of converting.

The files are DeepSpeed 0.19.8's, tensor for tensor (tests/test_ds_universal_peer.py), quirks
included: from stages 1-2 each state file is ``{"cat_dim": 0, "param": tensor}`` in the
parameter's shape, and every module entry no partition held (a tied weight's second name, a
buffer) gets an fp32.pt from the model-states file; from stage 3 each state file is the bare
flat tensor and there is no step.pt (the count is in optimizer_state.pt).

DeepSpeed extracts fragments into a temporary folder with pools of worker processes, because a
real model's optimizer state does not fit in one process; here everything stays in memory.
Tensor-parallel checkpoints are not converted: joining slices needs the per-parameter patterns
(row-parallel, replicated, vocabulary) that Megatron-DeepSpeed records in
``universal_checkpoint_info``.
"""

from __future__ import annotations

import argparse
import math
import pickle
import re
import shutil
import sys
from pathlib import Path

import torch

from minitron.runtime.checkpoint import constants as C
from minitron.runtime.checkpoint.pickles import load_state, save_state

_OPTIM_FILE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
_SHARDED = (C.BASE_OPTIMIZER_STATE, C.PARAM_SLICE_MAPPINGS, C.SINGLE_PARTITION_OF_FP32_GROUPS)


class ConversionError(ValueError):
    """What makes a folder unconvertible, in one line."""


def _load(path: Path) -> dict:
    try:
        return load_state(path)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        raise ConversionError(f"cannot read {path} ({type(exc).__name__}): the checkpoint is damaged; "
                              "save it again") from None


def _optim_files(folder: Path) -> list:
    """The optimizer partitions, in data-parallel rank order."""
    found: dict = {}
    for f in folder.iterdir():
        match = _OPTIM_FILE.match(f.name)
        if match:
            found.setdefault(int(match[2]), {})[int(match[1])] = f
    if not found:
        raise ConversionError(f"{folder} holds no *_optim_states.pt: give a tag folder (global_stepN) of a ZeRO "
                              "stage 1-3 checkpoint (stage 0 keeps its optimizer whole: nothing to convert)")
    if set(found) != {0}:
        raise ConversionError(f"{folder} was saved by {max(found) + 1} tensor-parallel ranks: minitron converts "
                              "tensor-parallel size 1 only")
    ranks = found[0]
    if sorted(ranks) != list(range(len(ranks))):
        gap = min(set(range(max(ranks) + 1)) - set(ranks))
        raise ConversionError(f"{folder} lacks the optimizer partition of data-parallel rank {gap}: "
                              "copy the whole tag folder")
    return [ranks[r] for r in range(len(ranks))]


def _address(where) -> tuple:
    """(start, numel) of a slice mapping: DeepSpeed's fragment_address (read back as a stand-in
    by pickles.py), minitron's SimpleNamespace, or the plain dict minitron once wrote."""
    where = where if isinstance(where, dict) else vars(where)
    return where["start"], where["numel"]


def _pieces_zero12(optims: list) -> tuple:
    """name -> state -> each rank's fragment in rank order, and name -> step, from stages 1-2:
    rank r's lean fp32 partition and its moments hold the elements its slice mappings say."""
    pieces, steps = {}, {}
    for optim in optims:
        sd = optim[C.OPTIMIZER_STATE_DICT]
        moments = sd[C.BASE_OPTIMIZER_STATE]["state"]   # one flat tensor per group: state g is group g's
        for g, mapping in enumerate(sd[C.PARAM_SLICE_MAPPINGS]):
            flat = {C.FP32_WEIGHT_KEY: sd[C.SINGLE_PARTITION_OF_FP32_GROUPS][g],
                    "exp_avg": moments[g]["exp_avg"], "exp_avg_sq": moments[g]["exp_avg_sq"]}
            for name, where in mapping.items():
                start, numel = _address(where)
                for key, tensor in flat.items():
                    pieces.setdefault(name, {}).setdefault(key, []).append(tensor.narrow(0, start, numel))
                if "step" in moments[g]:
                    steps[name] = moments[g]["step"]
    return pieces, steps


def _pieces_zero3(optims: list, param_shapes: list) -> dict:
    """The same from stage 3: each parameter was cut on its own into ceil(numel / dp) elements
    a rank, the last rank's piece padded; rank r's flat group holds its pieces end to end."""
    pieces, dp = {}, len(optims)
    for r, optim in enumerate(optims):
        sd = optim[C.OPTIMIZER_STATE_DICT]
        for g, shapes in enumerate(param_shapes):
            moments = sd[C.OPTIMIZER_STATE_DICT]["state"][g]
            flat = {C.FP32_WEIGHT_KEY: sd[C.FP32_FLAT_GROUPS][g],
                    "exp_avg": moments["exp_avg"], "exp_avg_sq": moments["exp_avg_sq"]}
            offset = 0
            for name, shape in shapes.items():
                numel = math.prod(shape)
                piece = -(-numel // dp)
                real = max(0, min(piece, numel - r * piece))   # the padding is left behind
                for key, tensor in flat.items():
                    pieces.setdefault(name, {}).setdefault(key, []).append(tensor.narrow(0, offset, real))
                offset += piece
    return pieces


def _save(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_state(value, path)   # the loss scaler goes on as DeepSpeed's object


def convert(input_folder, output_folder, inject_missing_state: bool = False) -> None:
    """``ds_to_universal.main``: read every rank's files in ``input_folder`` (one tag), write
    the universal checkpoint into ``output_folder`` and name it in its parent's latest_universal."""
    source, out = Path(input_folder), Path(output_folder).resolve()
    if not source.is_dir():
        raise ConversionError(f"--input_folder {source} is not a folder: give a checkpoint's tag folder, "
                              "such as CKPT/global_step2")
    if out == source.resolve():
        raise ConversionError("--output_folder is the --input_folder: write the universal checkpoint elsewhere")
    optim_files = _optim_files(source)
    optims = [_load(f) for f in optim_files]
    stage = int(optims[0][C.OPTIMIZER_STATE_DICT].get(C.ZERO_STAGE, 1))
    model_files = sorted(source.glob(f"*{C.MODEL_FILE_SUFFIX}"))
    rank0 = f"{C.ZERO_FILE_PREFIX}0_" if stage == 3 else ""   # stage 3: every rank wrote one; rank 0's
    first = source / f"{rank0}{C.MODEL_FILE_PREFIX}00{C.MODEL_FILE_SUFFIX}"
    if not first.is_file():
        raise ConversionError(f"{source} lacks {first.name}, which says where each parameter lies in the "
                              "partitions: copy the whole tag folder")
    model = _load(first)
    zero = out / C.UNIVERSAL_ZERO_FOLDER
    if stage <= 2:
        if model.get(C.UNIVERSAL_CHECKPOINT_INFO) is None and not inject_missing_state:
            raise ConversionError(f"{first} has no {C.UNIVERSAL_CHECKPOINT_INFO} (the client that saved it adds "
                                  "it, as pretrain --deepspeed does): pass --inject_missing_state to convert anyway")
        pieces, steps = _pieces_zero12(optims)
        for name, shape in ((n, s) for shapes in model[C.PARAM_SHAPES] for n, s in shapes.items()):
            for key, parts in pieces[name].items():
                _save(zero / name / f"{key}.pt", {C.CAT_DIM: 0, C.PARAM: torch.cat(parts).view(shape)})
            if name in steps:
                _save(zero / name / "step.pt", steps[name])
        for name, tensor in model["module"].items():   # what no partition held: tied names, buffers
            if not (zero / name / f"{C.FP32_WEIGHT_KEY}.pt").is_file():
                _save(zero / name / f"{C.FP32_WEIGHT_KEY}.pt", {C.PARAM: tensor.float()})
        common = {k: v for k, v in optims[0][C.OPTIMIZER_STATE_DICT].items() if k not in _SHARDED}
        common[C.GROUP_PADDINGS] = [0] * len(common[C.GROUP_PADDINGS])   # none left: every tensor is whole
        common[C.PARAM_GROUPS] = optims[0][C.OPTIMIZER_STATE_DICT][C.BASE_OPTIMIZER_STATE][C.PARAM_GROUPS]
    else:
        for name, parts in _pieces_zero3(optims, model[C.PARAM_SHAPES]).items():
            for key, fragments in parts.items():
                _save(zero / name / f"{key}.pt", torch.cat(fragments))
        common = dict(optims[0][C.OPTIMIZER_STATE_DICT])
        common[C.PARAM_GROUPS] = common[C.OPTIMIZER_STATE_DICT][C.PARAM_GROUPS]
    _save(zero / C.UNIVERSAL_OPTIMIZER_STATE, common)
    for f in model_files:
        shutil.copy2(f, out)
    (out.parent / C.LATEST_UNIVERSAL).write_text(out.name)


class _Parser(argparse.ArgumentParser):
    def error(self, message):   # argparse would print its usage too; the house rule is one line
        print(f"ds_to_universal: {message} (python -m minitron.runtime.checkpoint.ds_to_universal "
              "--input_folder CKPT/global_stepN --output_folder OUT/global_stepN)", file=sys.stderr)
        sys.exit(2)


def main(argv=None) -> None:
    parser = _Parser(prog="python -m minitron.runtime.checkpoint.ds_to_universal",
                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--input_folder", required=True, help="a checkpoint's tag folder (CKPT/global_stepN)")
    parser.add_argument("--output_folder", required=True, help="where the universal checkpoint goes")
    parser.add_argument("--inject_missing_state", action="store_true",
                        help=f"convert a stage 1-2 checkpoint whose client wrote no {C.UNIVERSAL_CHECKPOINT_INFO}")
    args = parser.parse_args(argv)
    try:
        convert(args.input_folder, args.output_folder, args.inject_missing_state)
    except ConversionError as refusal:
        print(f"ds_to_universal: {refusal}", file=sys.stderr)
        sys.exit(2)
    print(f"ds_to_universal: wrote {args.output_folder}")


if __name__ == "__main__":
    main()
