"""pretrain()'s step 3: datasets -> data loaders -> iterators, on every rank.

    build_train_valid_test_data_iterators(provider)
    └─ build_train_valid_test_data_loaders(provider)
       ├─ build_train_valid_test_datasets(provider)      sample counts from the batch arithmetic
       │  └─ provider(num_samples)  ->  BlendedMegatronDatasetBuilder(...).build()   (barriers)
       ├─ build_pretraining_data_loader(ds, consumed)    data_samplers.py
       └─ broadcast(do_train, do_valid, do_test) from rank 0

Every rank runs all of it (the builder's barriers need every rank), but only ranks that
need data end up with a loader: GPT's provider builds datasets on tensor-parallel rank 0 of the
first and last pipeline stages (``is_dataset_built_on_rank``). The others get None and receive
their batches from TP rank 0 (training/utils.get_batch).
"""

from __future__ import annotations

import copy

import torch

from minitron.accelerator import get_accelerator
from minitron.core import parallel_state as mpu
from minitron.trace import traced
from minitron.training.datasets.data_samplers import build_pretraining_data_loader
from minitron.training.global_vars import get_args
from minitron.training.utils import print_rank_0


def cyclic_iter(iterable):
    """Restart the loader whenever it runs dry (``--dataloader-type cyclic``)."""
    while True:
        for x in iterable:
            yield x


def get_train_valid_test_num_samples(args=None) -> tuple[int, int, int]:
    """How many samples each split must provide for the whole run.

    train: --train-samples, or one global batch per iteration. valid: eval_iters batches at
    every evaluation (one every eval_interval iterations, plus Megatron's one at the end).
    test: one evaluation.
    """
    args = args or get_args()
    train_samples = args.train_samples or args.train_iters * args.global_batch_size
    evaluations = (args.train_iters // args.eval_interval if args.eval_interval else 0) + 1
    eval_batch = getattr(args, "eval_global_batch_size", None) or args.global_batch_size   # --eval-global-batch-size
    return train_samples, evaluations * args.eval_iters * eval_batch, args.eval_iters * eval_batch


@traced
def build_train_valid_test_datasets(build_train_valid_test_datasets_provider):
    num_samples = get_train_valid_test_num_samples()
    print_rank_0(f" > datasets target sizes (minimum size): train {num_samples[0]}, "
                 f"validation {num_samples[1]}, test {num_samples[2]}")
    return build_train_valid_test_datasets_provider(num_samples)


@traced
def build_train_valid_test_data_loaders(build_train_valid_test_datasets_provider):
    args = get_args()
    train_dataloader = valid_dataloader = test_dataloader = None
    print_rank_0("> building train, validation, and test datasets ...")

    # A distributed-aware provider (GPT's) must run on every rank: it holds barriers.
    is_distributed = getattr(build_train_valid_test_datasets_provider, "is_distributed", False)
    if is_distributed or mpu.get_tensor_model_parallel_rank() == 0:
        train_ds, valid_ds, test_ds = build_train_valid_test_datasets(build_train_valid_test_datasets_provider)
        train_dataloader = build_pretraining_data_loader(train_ds, args.consumed_train_samples)
        # Validation starts from its first sample on every run: minitron's checkpoints do not
        # record Megatron's consumed_valid_samples.
        # Evaluation reads --eval-micro-batch-size samples at a time (the training's by default).
        eval_args = copy.copy(args)
        eval_args.micro_batch_size = getattr(args, "eval_micro_batch_size", None) or args.micro_batch_size
        valid_dataloader = build_pretraining_data_loader(valid_ds, 0, args=eval_args)
        test_dataloader = build_pretraining_data_loader(test_ds, 0, args=eval_args)
        flags = [train_dataloader is not None and args.train_iters > 0,
                 valid_dataloader is not None and args.eval_iters > 0,
                 test_dataloader is not None and args.eval_iters > 0]
    else:
        flags = [False, False, False]
    # Rank 0 always has the loaders; everyone learns from it whether to train, validate, test.
    flags = torch.tensor([int(f) for f in flags], dtype=torch.long, device=get_accelerator().current_device_name())
    torch.distributed.broadcast(flags, 0)
    args.do_train, args.do_valid, args.do_test = (bool(f) for f in flags.tolist())
    return train_dataloader, valid_dataloader, test_dataloader


@traced
def build_train_valid_test_data_iterators(build_train_valid_test_datasets_provider):
    """(train, valid, test) iterators; None on ranks that read no data."""
    args = get_args()
    loaders = build_train_valid_test_data_loaders(build_train_valid_test_datasets_provider)
    kind = args.dataloader_type or "single"

    def _get_iterator(dataloader):
        if dataloader is None:
            return None
        if kind == "single":
            return iter(dataloader)
        if kind == "cyclic":
            return iter(cyclic_iter(dataloader))
        return dataloader  # external: the caller's object, iterated as it likes

    return tuple(_get_iterator(loader) for loader in loaders)
