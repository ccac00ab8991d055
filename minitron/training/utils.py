"""Megatron's training utilities: who prints, get_batch (the micro-batch a rank computes on), and
reduce_losses (the loss a step reports).

Printing. Megatron's console lines come from one rank each: rank 0 for set-up news
(print_rank_0), the last rank for what only the last pipeline stage knows, the loss
(print_rank_last). Under minitron's launcher a rank's stdout goes to its own log file; when the
launching process wants those lines on its console it names a file in ``MINITRON_CONSOLE`` and
every such print is also appended there, one JSON object per line, for it to show.

get_batch. The ranks of a TP group split the *model*, not the data: all of them need the same
batch. Only TP rank 0 has a data iterator; it reads the batch and broadcasts it to its group.
And not every pipeline stage needs every tensor:

    first stage    tokens, position_ids, attention_mask   (the embedding's inputs)
    last stage     labels, loss_mask, attention_mask      (the loss's inputs)
    middle stages  nothing: their input is the previous stage's activations

So a middle stage reads nothing and broadcasts nothing; with one stage, all five travel.
"""

from __future__ import annotations

import json
import os

import torch

from minitron.core import parallel_state as mpu
from minitron.core.tensor_parallel import broadcast_data
from minitron.core.utils import get_data_parallel_group_if_dtensor, to_local_if_dtensor
from minitron.trace import traced
from minitron.training import global_vars

# The launching process's console, if it wants one: a file it reads while the ranks run.
CONSOLE_ENV = "MINITRON_CONSOLE"


def is_last_rank() -> bool:
    return torch.distributed.get_rank() == torch.distributed.get_world_size() - 1


def print_to_console(message: str) -> None:
    """print(), and append the line to the launcher's console file when one is named.

    One os.write of one line to a file opened with O_APPEND: the kernel puts each write at the
    end whole, so lines of several ranks never interleave mid-line.
    """
    print(message, flush=True)
    path = os.environ.get(CONSOLE_ENV)
    if path:
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps({"rank": rank, "text": message}) + "\n").encode())
        finally:
            os.close(fd)


def print_rank_0(message: str) -> None:
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        print_to_console(message)


def print_rank_last(message: str) -> None:
    """The last rank of the world has the highest coordinate along every dimension, in either
    rank order, so it sits on the last pipeline stage and holds the loss."""
    if not torch.distributed.is_initialized() or is_last_rank():
        print_to_console(message)


# Which keys each kind of stage needs, grouped by dtype: one broadcast_data call per group.
_FIRST = {torch.int64: ["tokens", "position_ids"]}
_LAST = {torch.int64: ["labels"], torch.float32: ["loss_mask"]}


def _first_and_last_stage(vp_stage: int | None = None) -> tuple[bool, bool]:
    """(first stage?, last stage?) for model chunk ``vp_stage``, or for the whole rank when it is
    None, as Megatron's is_first_or_last_pipeline_stage asks them."""
    ignore_virtual = vp_stage is None
    return (mpu.is_pipeline_first_stage(ignore_virtual=ignore_virtual, vp_stage=vp_stage),
            mpu.is_pipeline_last_stage(ignore_virtual=ignore_virtual, vp_stage=vp_stage))


def _keys_for_this_stage(create_attention_mask: bool, vp_stage: int | None = None) -> dict:
    first, last = _first_and_last_stage(vp_stage)
    if last and _args_flag("mtp_num_layers", None):   # multi-token prediction embeds on the last stage
        first = True
    wanted: dict = {}
    for needed, groups in ((first, _FIRST), (last, _LAST)):
        if needed:
            for dtype, keys in groups.items():
                wanted.setdefault(dtype, []).extend(keys)
    if (first or last) and create_attention_mask:
        wanted[torch.bool] = ["attention_mask"]
    return wanted


@traced(args=lambda data_iterator, create_attention_mask=True, vp_stage=None: {
    "reads": data_iterator is not None, "tp_rank": mpu.get_tensor_model_parallel_rank()})
def get_batch_on_this_tp_rank(data_iterator, create_attention_mask: bool = True, vp_stage: int | None = None) -> dict:
    """{tokens, labels, loss_mask, attention_mask, position_ids}; the ones this stage does not
    need are None. TP rank 0 reads from ``data_iterator``; the others may pass None."""
    batch = dict.fromkeys(["tokens", "labels", "loss_mask", "attention_mask", "position_ids"])
    data = next(data_iterator) if mpu.get_tensor_model_parallel_rank() == 0 else None
    wanted = _keys_for_this_stage(create_attention_mask, vp_stage)
    if data is not None:
        missing = [k for keys in wanted.values() for k in keys if k not in data]
        if missing:  # the receivers expect it: failing here beats a hang in the broadcast
            raise KeyError(f"the batch has no {missing[0]!r}; is --no-create-attention-mask-in-dataloader "
                           "set on some ranks and not others?")
    for dtype, keys in wanted.items():
        received = broadcast_data(keys, None if data is None else {k: data[k].to(dtype) for k in keys}, dtype)
        batch.update(received)
    return batch


def get_batch_on_this_cp_rank(batch: dict, cp_rank: int | None = None, cp_size: int | None = None) -> dict:
    """Keep this context-parallel rank's share of the sequence dimension.

    The sequence is cut into 2 x cp chunks and rank r keeps chunks r and 2cp-1-r: causal
    attention does more work late in the sequence, so pairing an early chunk with a late one
    gives every rank the same amount of work (core/transformer/context_parallel.py). Tokens,
    labels, loss mask and position ids are all cut alike, so each token keeps its own position
    and target; the [b, 1, s, s] mask keeps this rank's query rows and every key column.
    """
    cp_size = mpu.get_context_parallel_world_size() if cp_size is None else cp_size
    if cp_size == 1:
        return batch
    cp_rank = mpu.get_context_parallel_rank() if cp_rank is None else cp_rank
    out = {}
    for key, value in batch.items():
        if value is None:
            out[key] = None
            continue
        seq_dim = 2 if key == "attention_mask" else 1
        before, length, after = value.shape[:seq_dim], value.shape[seq_dim], value.shape[seq_dim + 1:]
        index = torch.tensor([cp_rank, 2 * cp_size - cp_rank - 1], device=value.device)
        chunked = value.view(*before, 2 * cp_size, length // (2 * cp_size), *after)
        out[key] = chunked.index_select(seq_dim, index).view(*before, -1, *after)
    return out


def get_batch(data_iterator, create_attention_mask: bool | None = None, vp_stage: int | None = None):
    """(tokens, labels, loss_mask, attention_mask, position_ids) for GPT's forward_step, for
    model chunk ``vp_stage`` (None: the whole rank; needed with a virtual pipeline)."""
    if not any(_first_and_last_stage(vp_stage)):
        return None, None, None, None, None  # a middle stage reads no data at all
    if create_attention_mask is None:
        create_attention_mask = _args_flag("create_attention_mask_in_dataloader", True)
    batch = get_batch_on_this_tp_rank(data_iterator, create_attention_mask, vp_stage)
    batch = get_batch_on_this_cp_rank(batch)
    return (batch["tokens"], batch["labels"], batch["loss_mask"], batch["attention_mask"],
            batch["position_ids"])


def _args_flag(name: str, default):
    args = global_vars._GLOBAL_ARGS
    return default if args is None else getattr(args, name, default)


def reduce_losses(losses_reduced) -> dict:
    """One number per key from the micro-batches' reports: a [sum, count] pair is added up over
    the micro-batches and the data-parallel-with-context ranks and divided once (Megatron's
    token-weighted mean); a plain value is averaged over the micro-batches. train_step calls it
    on Megatron's path and on DeepSpeed's (deepspeed_training.py), so it lives below both."""
    loss = {}
    for key in losses_reduced[0]:
        values = torch.stack([d[key].view(-1) for d in losses_reduced]).float()
        if values.size(1) == 2:
            total = values.sum(dim=0)
            group = mpu.get_data_parallel_group(with_context_parallel=True)
            torch.distributed.all_reduce(total, group=group)
            loss[key] = (total[0] / total[1].clamp(min=1)).item()
        else:
            loss[key] = values.mean().item()
    return loss


def calc_params_l2_norm(model) -> float:
    """Megatron's --log-params-norm: the L2 norm of every parameter of the model, each value
    counted once, so every layout of the same weights prints the same number.

    A rank sums the squares of its own share: tensor-parallel slices, and a replicated tensor
    (a norm's weight, a bias) on tp rank 0 only; not the output layer's copy of a tied embedding
    (``shared``). The dense sum is then added over the model-parallel group (tp x pp), the
    experts' over theirs (expert tp x ep x pp) when it differs. Where the optimizer keeps an fp32
    main copy (fp16/bf16 with the plain optimizer) that copy is read, as Megatron reads it; the
    distributed optimizer's shards are not, so a bf16 run with it reads the bf16 weights."""
    # lazy: the optimizer package imports training-side helpers' neighbours, not this module
    from minitron.core.optimizer.clip_grads import param_is_not_shared
    from minitron.core.tensor_parallel.layers import param_is_not_tensor_parallel_duplicate

    device = torch.device(to_local_if_dtensor(next(model[0].parameters())).device)
    sums = {"dense": torch.zeros(1, dtype=torch.float32, device=device),
            "expert": torch.zeros(1, dtype=torch.float32, device=device)}
    fsdp2_group = None   # --use-torch-fsdp2: each dp rank holds its rows of every parameter
    # Megatron-FSDP's optim_grads_params keeps only pieces of the units (their storage is freed
    # between steps): each rank reads its pieces, summed over each unit's group below
    pieces = {"dense": torch.zeros(1, dtype=torch.float32, device=device),
              "expert": torch.zeros(1, dtype=torch.float32, device=device)}
    for chunk in model:
        sharded = getattr(chunk, "strategy", None) == "optim_grads_params"
        for param in chunk.parameters():
            if not param_is_not_tensor_parallel_duplicate(param) or not param_is_not_shared(param):
                continue
            if sharded:
                found = chunk.unit_of[param].piece(param)
                if found is not None:
                    pieces["dense" if getattr(param, "allreduce", True) else "expert"] += \
                        torch.sum(found[0].detach().float() ** 2)
                continue
            data = getattr(param, "main_param", None)
            data = param if data is None else data
            fsdp2_group = get_data_parallel_group_if_dtensor(data, fsdp2_group)
            data = to_local_if_dtensor(data.detach()).float()
            sums["dense" if getattr(param, "allreduce", True) else "expert"] += torch.sum(data * data)
    if fsdp2_group is not None:   # the rows' sums over dp first, both kinds in one collective
        both = torch.cat([sums["dense"], sums["expert"]])
        torch.distributed.all_reduce(both, group=fsdp2_group)
        sums = {"dense": both[:1], "expert": both[1:]}
    if any(getattr(chunk, "strategy", None) == "optim_grads_params" for chunk in model):
        torch.distributed.all_reduce(pieces["dense"], group=mpu.get_data_parallel_group(with_context_parallel=True))
        torch.distributed.all_reduce(pieces["expert"], group=mpu.get_expert_data_parallel_group())
        sums = {kind: sums[kind] + pieces[kind] for kind in sums}
    dense_group = mpu.get_model_parallel_group()
    expert_ranks, dense_ranks = mpu.get_global_ranks("tp-ep-pp"), mpu.get_global_ranks("tp-pp")
    if expert_ranks == dense_ranks:   # one sum over one group: the same collective as a dense model's
        total = sums["dense"] + sums["expert"]
        torch.distributed.all_reduce(total, group=dense_group)
    else:
        torch.distributed.all_reduce(sums["dense"], group=dense_group)
        torch.distributed.all_reduce(sums["expert"], group=mpu.get_group("tp-ep-pp"))
        total = sums["dense"] + sums["expert"]
    return total.item() ** 0.5
