"""Pretrain GPT: the entry point, as Megatron's pretrain_gpt.py is.

Every rank runs this file. Under minitron's launcher each forked or spawned rank runs it as
``__main__``; under torchrun you run it yourself::

    torchrun --nproc-per-node 4 -m minitron.pretrain_gpt --tensor-model-parallel-size 2 ...

What a model family supplies is here — how to build this rank's piece of the model, where the
data comes from, what one forward step and its loss are; pretrain() supplies everything else.
"""

from __future__ import annotations

import os
import sys
from functools import partial

import torch

from minitron.core import parallel_state as mpu
from minitron.core.datasets import (
    BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig, MockGPTDataset, get_blend_from_list,
)
from minitron.core.models.gpt import GPTModel
from minitron.core.pipeline_parallel.schedules import get_attr_wrapped_model
from minitron.launcher.worker import rank_session
from minitron.trace import traced
from minitron.training.arguments import GPT_ARGS_DEFAULTS, ArgumentError, core_transformer_config_from_args
from minitron.training.global_vars import get_args, get_tokenizer
from minitron.training.training import destroy_global_state, pretrain
from minitron.training.utils import get_batch, print_rank_0

# Defaults for flags a user did not give: token-id data over a small vocabulary, so a command
# line can stay about the parallel layout (the values sit in training/arguments.py, where the
# command line reads them without importing torch).
ARGS_DEFAULTS = GPT_ARGS_DEFAULTS


# The trace records where this chunk sits, and that the chunk learns it from its arguments: the
# process-wide "current virtual rank" that older Megatron advanced before each call is never
# advanced here (it stays at 0 with a virtual pipeline, None without one).
@traced(args=lambda pre_process=True, post_process=True, vp_stage=None: {
    "pre_process": pre_process, "post_process": post_process, "vp_stage": vp_stage,
    "global_virtual_rank": mpu.get_virtual_pipeline_model_parallel_rank()})
def model_provider(pre_process: bool = True, post_process: bool = True, vp_stage=None) -> GPTModel:
    """This rank's GPT: the layers of its pipeline stage, each weight its tensor-parallel slice."""
    args = get_args()
    config = core_transformer_config_from_args(args)
    return GPTModel(config, vocab_size=args.padded_vocab_size, max_sequence_length=args.max_position_embeddings,
                    pre_process=pre_process, post_process=post_process,
                    share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
                    position_embedding_type=args.position_embedding_type, rotary_percent=args.rotary_percent,
                    rotary_base=args.rotary_base, rope_scaling=args.use_rope_scaling,
                    rope_scaling_factor=args.rope_scaling_factor,
                    seq_len_interpolation_factor=args.rotary_seq_len_interpolation_factor, vp_stage=vp_stage)


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    """(sum of this micro-batch's unmasked per-token losses, their count, report), as Megatron's.

    Nothing is averaged here. The schedule divides the sum by the count (and by the number of
    micro-batches) before backward; train_step adds up the reported [sum, count] pairs of every
    micro-batch and every data-parallel and context-parallel rank, and divides once. With context
    parallelism each rank holds only its chunks of the sequence, so its own sum and count are
    partial: only that global division gives the serial run's mean.
    """
    losses = output_tensor.float().view(-1)
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * mask)
    num_tokens = mask.sum().clone().detach().to(torch.int)
    report = {"lm loss": torch.cat([loss.clone().detach().view(1), num_tokens.view(1).float()])}
    return loss, num_tokens, report


def forward_step(data_iterator, model):
    """One micro-batch: tokens in (first stage), per-token losses out (last stage)."""
    vp_stage = get_attr_wrapped_model(model, "vp_stage")  # which model chunk, with a virtual pipeline
    tokens, labels, loss_mask, attention_mask, position_ids = get_batch(data_iterator, vp_stage=vp_stage)
    output_tensor = model(tokens, position_ids, attention_mask, labels=labels, loss_mask=loss_mask)
    return output_tensor, partial(loss_func, loss_mask)


def is_dataset_built_on_rank() -> bool:
    """Only the ranks that feed the model read data: TP rank 0 of the first and last stage."""
    return ((mpu.is_pipeline_first_stage(ignore_virtual=True) or mpu.is_pipeline_last_stage(ignore_virtual=True))
            and mpu.get_tensor_model_parallel_rank() == 0)


def core_gpt_dataset_config_from_args(args) -> GPTDatasetConfig:
    return GPTDatasetConfig(
        random_seed=args.seed, sequence_length=args.seq_length,
        blend=None if args.mock_data else get_blend_from_list(args.data_path),
        split=args.split, path_to_cache=args.data_cache_path, tokenizer=get_tokenizer(),
        reset_position_ids=args.reset_position_ids, reset_attention_mask=args.reset_attention_mask,
        eod_mask_loss=args.eod_mask_loss, create_attention_mask=args.create_attention_mask_in_dataloader)


def train_valid_test_datasets_provider(train_val_test_num_samples):
    """Mock tokens or a preprocessed corpus, blended and split as --data-path / --split say;
    built (or loaded from cache) on the ranks that read data, None elsewhere."""
    args = get_args()
    config = core_gpt_dataset_config_from_args(args)
    dataset_type = MockGPTDataset if config.mock else GPTDataset
    print_rank_0("> building train, validation, and test datasets for GPT ...")
    train_ds, valid_ds, test_ds = BlendedMegatronDatasetBuilder(
        dataset_type, train_val_test_num_samples, is_dataset_built_on_rank, config).build()
    print_rank_0("> finished creating GPT datasets ...")
    return train_ds, valid_ds, test_ds


# Every rank calls it (the builder's barriers need all of them), as Megatron marks it.
train_valid_test_datasets_provider.is_distributed = True


@traced(name="minitron.pretrain_gpt.__main__")
def run_main(argv: list[str] | None = None) -> None:
    """What Megatron's ``if __name__ == "__main__":`` block does: hand the three pieces to
    pretrain(). A block cannot be traced, so here it is a function, recorded under the block's
    name: the first step of every rank's trace is the place where every rank starts."""
    pretrain(train_valid_test_datasets_provider, model_provider, "encoder_or_decoder", forward_step,
             args_defaults=ARGS_DEFAULTS, argv=argv)


def main(argv: list[str] | None = None, run=run_main) -> int:
    # `run` is the traced entry: this module's run_main, or pretrain_hybrid's, which shares
    # this body rather than repeating it.
    # minitron's one addition to Megatron's entry: the per-rank session (tracing, debugger),
    # driven by environment variables so it behaves the same under any launcher. It opens
    # before the traced entry, since it is what starts the recorder.
    try:
        with rank_session():
            run(argv)
    except ArgumentError as exc:
        # Under torchrun no one checked the flags before the ranks started (minitron's own
        # commands do, in the launching process), so every rank finds the same bad flag: one
        # line from rank 0 says it, exit code 2 from all, and no traceback per rank.
        if os.environ.get("RANK", "0") == "0":
            print(f"minitron: error: {exc}", file=sys.stderr)
        return 2
    # Leave the world before the interpreter exits, as torch asks of every program: a gloo
    # group's threads alive at exit can abort the process (see destroy_global_state). Only
    # on success: a group whose peer is gone may never drain, and the failure is told anyway.
    destroy_global_state()
    return 0


if __name__ == "__main__":
    sys.exit(main())
