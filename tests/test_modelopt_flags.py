"""ModelOpt's architecture flags (issue #36): --export-qk-l2-norm, --export-moe-apply-probs-on-input
and --enable-gpt-oss give the TransformerConfig that pretraining's own flags give, as
megatron/post_training/model_builder.py sets those fields."""

from __future__ import annotations

import dataclasses

import pytest

from minitron.training.arguments import build_parser, core_transformer_config_from_args, validate_args

BASE = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
        "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters", "1", "--lr", "1e-3", "--mock-data",
        "--distributed-backend", "gloo"]
MOE = ["--num-experts", "2", "--moe-router-topk", "1", "--moe-router-pre-softmax"]


def _config(*flags):
    args = build_parser().parse_args(BASE + list(flags))
    args.world_size, args.rank = 1, 0
    config = core_transformer_config_from_args(validate_args(args))
    # the init functions are fresh closures each time: compare the fields that are values; the
    # position embedding's type is GPTModel's argument (model_setup.py), not a config field
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
            if not callable(getattr(config, f.name))} | {"position_embedding_type": args.position_embedding_type}


@pytest.mark.parametrize("modelopt,megatron", [
    (["--export-qk-l2-norm"], ["--qk-l2-norm"]),
    (MOE + ["--export-moe-apply-probs-on-input"], MOE + ["--moe-apply-probs-on-input"]),
    (["--enable-gpt-oss"], ["--position-embedding-type", "yarn", "--rotary-scaling-factor", "32",
                            "--yarn-original-max-position-embeddings", "131072", "--yarn-beta-fast", "32",
                            "--yarn-beta-slow", "1", "--no-yarn-correction-range-round-to-int"]),
])
def test_modelopt_s_flag_builds_the_config_of_megatron_s(modelopt, megatron):
    base, alias, spelled = _config(*modelopt[:-1]), _config(*modelopt), _config(*megatron)
    assert alias == spelled and alias != base


def test_gpt_oss_yarn_values_are_model_builder_s():
    config = _config("--enable-gpt-oss", "--rotary-base", "150000")   # as conf/openai/gpt-oss-20b.sh
    assert (config["position_embedding_type"], config["rotary_base"], config["yarn_rotary_scaling_factor"],
            config["yarn_original_max_position_embeddings"], config["yarn_beta_fast"], config["yarn_beta_slow"],
            config["yarn_mscale"], config["yarn_mscale_all_dim"], config["yarn_correction_range_round_to_int"]) == \
        ("yarn", 150000, 32.0, 131072, 32.0, 1.0, 1.0, 0.0, False)


def test_position_flags_given_beside_the_preset_win_as_in_megatron_s_pretraining():
    """examples/gptoss/02_train.sh passes --position-embedding-type rope with --enable-gpt-oss:
    Megatron's pretraining builds its own GPT (ModelOpt's builder, the only reader of the preset,
    runs only from a ModelOpt checkpoint), so the rope is built, and the header says why."""
    from minitron.training.arguments_policy import no_effect_lines
    args = build_parser().parse_args(BASE + ["--enable-gpt-oss", "--position-embedding-type", "rope"])
    args.world_size, args.rank = 1, 0
    validate_args(args)
    assert (args.position_embedding_type, args.rotary_scaling_factor) == ("rope", 1.0)
    assert any("--enable-gpt-oss: ModelOpt's YaRN preset" in line and "--position-embedding-type" in line
               for line in no_effect_lines(args))


def test_the_l2_norm_takes_the_place_of_qk_layernorm_as_in_megatron_s_spec():
    """Llama-4 Scout's configuration passes --qk-layernorm beside --export-qk-l2-norm: Megatron's
    layer spec then builds the weightless L2 norm, and so does minitron (saying so)."""
    from minitron.training.arguments_policy import no_effect_lines
    args = build_parser().parse_args(BASE + ["--qk-layernorm", "--export-qk-l2-norm"])
    args.world_size, args.rank = 1, 0
    validate_args(args)
    assert (args.qk_l2_norm, args.qk_layernorm) == (True, False)
    assert no_effect_lines(args) == ["accepted, no effect here: --qk-layernorm: --qk-l2-norm takes its place "
                                     "(Megatron's layer spec builds the L2 norm)"]
    assert _config("--qk-layernorm", "--export-qk-l2-norm") == _config("--qk-l2-norm")
