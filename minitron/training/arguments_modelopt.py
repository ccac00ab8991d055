"""ModelOpt's model-architecture flags, as its example configurations pass them
(examples/post_training/modelopt/conf/: Llama-4 Scout/Maverick, gpt-oss 20b/120b).

Megatron's post-training argument provider (megatron/post_training/arguments.py) adds them and
its model builder (megatron/post_training/model_builder.py) turns them into TransformerConfig
fields that pretraining's own flags also set. So minitron takes each as an alias of that flag:
the same config, not a second way of building it. (Megatron's pretrain_gpt.py parses them too,
when ModelOpt is installed, but builds with them only from a ModelOpt checkpoint; minitron, which
has no ModelOpt, builds the model those configurations describe.) Torch-free: validate_args calls
apply_modelopt_flags first, because the gpt-oss preset chooses the position embedding that
every later check reads.
"""

from __future__ import annotations

from minitron.training.arguments_policy import note_no_effect

# ModelOpt's model builder sets exactly these on the config for --enable-gpt-oss (Hugging Face's
# gpt-oss rope), whatever the position flags said: {args field: value} under minitron's names.
GPT_OSS_YARN = {"position_embedding_type": "yarn", "rotary_scaling_factor": 32.0,
                "yarn_original_max_position_embeddings": 131072, "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0,
                "mscale": 1.0, "mscale_all_dim": 0.0, "yarn_correction_range_round_to_int": False}
FLAG = {"position_embedding_type": "--position-embedding-type", "rotary_scaling_factor": "--rotary-scaling-factor",
        "yarn_original_max_position_embeddings": "--yarn-original-max-position-embeddings",
        "yarn_beta_fast": "--yarn-beta-fast", "yarn_beta_slow": "--yarn-beta-slow", "mscale": "--mscale",
        "mscale_all_dim": "--mscale-all-dim",
        "yarn_correction_range_round_to_int": "--(no-)yarn-correction-range-round-to-int"}
# what a flag left alone holds (argument_groups_model.py's defaults): only these may be overwritten
UNSET = {"position_embedding_type": "learned_absolute", "rotary_scaling_factor": 1.0, "mscale": 1.0,
         "mscale_all_dim": 0.0}


def add_modelopt_args(g) -> None:
    # megatron/post_training/model_builder.py: config.qk_l2_norm = args.export_qk_l2_norm
    g.add_argument("--export-qk-l2-norm", action="store_true", dest="qk_l2_norm",
                   help="ModelOpt's name for --qk-l2-norm (Llama 4)")
    # megatron/post_training/model_builder.py: config.moe_apply_probs_on_input = args.export_moe_apply_probs_on_input
    g.add_argument("--export-moe-apply-probs-on-input", action="store_true", dest="moe_apply_probs_on_input",
                   help="ModelOpt's name for --moe-apply-probs-on-input (Llama 4)")
    # megatron/post_training/model_builder.py: gpt-oss's YaRN values set on the config
    g.add_argument("--enable-gpt-oss", action="store_true",
                   help="ModelOpt's gpt-oss rope: --position-embedding-type yarn --rotary-scaling-factor 32 "
                        "--yarn-original-max-position-embeddings 131072 --no-yarn-correction-range-round-to-int")


def apply_modelopt_flags(args) -> None:
    """--enable-gpt-oss: the preset, as ModelOpt's builder sets it, where the flags leave the
    position embedding open (the gpt-oss configurations). Where they choose it themselves
    (examples/gptoss/02_train.sh passes --position-embedding-type rope beside it), the run is
    Megatron's pretraining from scratch, which builds its own GPT and so never applies the
    preset: the flags win, and the header says the preset was not applied."""
    if not getattr(args, "enable_gpt_oss", False):
        return
    chosen = [FLAG[name] for name, value in GPT_OSS_YARN.items()
              if getattr(args, name) not in (None, value, UNSET.get(name))]
    if chosen:
        note_no_effect(args, f"--enable-gpt-oss: ModelOpt's YaRN preset is applied by its model builder only, "
                             f"and {', '.join(chosen)} given here choose the rope as Megatron's pretraining builds it")
        return
    for name, value in GPT_OSS_YARN.items():
        setattr(args, name, value)
