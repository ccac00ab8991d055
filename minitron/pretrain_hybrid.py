"""Pretrain a hybrid model (Mamba-2 layers beside attention): Megatron's pretrain_hybrid.py.

Every rank runs this file, as pretrain_gpt.py; ``minitron pretrain`` picks it when the flags
carry ``--hybrid-layer-pattern``, and under torchrun you name it yourself::

    torchrun --nproc-per-node 2 -m minitron.pretrain_hybrid --hybrid-layer-pattern "M-M*-" ...

Only the model differs from a GPT's run: the data, the forward step and the loss are the same
functions (Megatron's pretrain_hybrid repeats them; here they are imported), and pretrain()
builds the same groups and runs the same schedules.
"""

from __future__ import annotations

import sys

from minitron.core.models.hybrid import HybridModel
from minitron.pretrain_gpt import ARGS_DEFAULTS, forward_step, train_valid_test_datasets_provider
from minitron.pretrain_gpt import main as gpt_main   # the per-rank session around run_main, shared
from minitron.trace import traced
from minitron.training.arguments import ArgumentError, core_transformer_config_from_args
from minitron.training.global_vars import get_args
from minitron.training.training import pretrain
from minitron.training.utils import print_rank_0


@traced(args=lambda pre_process=True, post_process=True, vp_stage=None: {
    "pre_process": pre_process, "post_process": post_process, "vp_stage": vp_stage,
    "pattern": get_args().hybrid_layer_pattern})
def model_provider(pre_process: bool = True, post_process: bool = True, vp_stage=None) -> HybridModel:
    """This rank's hybrid model: its pipeline segment of the pattern, each weight its TP slice."""
    args = get_args()
    if args.hybrid_layer_pattern is None:
        raise ArgumentError("pretrain_hybrid needs --hybrid-layer-pattern (e.g. M-M*-): without it the model is a GPT")
    print_rank_0("building Hybrid model ...")
    config = core_transformer_config_from_args(args)
    model = HybridModel(config, vocab_size=args.padded_vocab_size, max_sequence_length=args.max_position_embeddings,
                        hybrid_layer_pattern=args.hybrid_layer_pattern, pre_process=pre_process,
                        post_process=post_process,
                        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
                        position_embedding_type=args.position_embedding_type, rotary_percent=args.rotary_percent,
                        rotary_base=args.rotary_base, vp_stage=vp_stage)
    # As Megatron's hybrid builder: each layer's parameter count, so a reader sees what M, *, - cost.
    for i, layer in enumerate(model.decoder.layers):
        count = sum(p.numel() for p in layer.parameters())
        print_rank_0(f" == params layer {layer.layer_number - 1} ({model.decoder.layer_type_list[i]}): {count}")
    return model


@traced(name="minitron.pretrain_hybrid.__main__")
def run_main(argv: list[str] | None = None) -> None:
    pretrain(train_valid_test_datasets_provider, model_provider, "encoder_or_decoder", forward_step,
             args_defaults=ARGS_DEFAULTS, argv=argv)


def main(argv: list[str] | None = None) -> int:
    """pretrain_gpt.main around this module's traced entry: the per-rank session, one line for bad flags."""
    return gpt_main(argv, run=run_main)


if __name__ == "__main__":
    sys.exit(main())
