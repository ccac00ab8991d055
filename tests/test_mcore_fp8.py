"""minitron's fp8 flags against Megatron 0.19.2's own parser and config (marked mcore).

Megatron-Core 0.19.2 has no fp8 arithmetic of its own to hold minitron's against: the delayed
and current scaling rules live in Transformer Engine (megatron/core/fp8_utils.py only builds
TE's recipe objects and opens TE's context), and its one fp8 cast in plain reach is a Triton
MXFP8 kernel for inference, a recipe minitron refuses. So the peer check is of the interface:
each flag minitron builds parses to the same destination, default and value as in Megatron's
parser, and the TransformerConfig fields they fill have Megatron-Core's defaults; and the one
fp8 rule of Megatron's MoE code, the multiple an expert's rows are padded to.
"""

from __future__ import annotations

import argparse
import dataclasses

import pytest

pytestmark = pytest.mark.mcore
try:
    from megatron.core.transformer.transformer_config import TransformerConfig as McoreConfig
    from megatron.training.arguments import add_megatron_arguments
except ImportError as exc:
    pytest.skip(f"megatron does not import ({exc})", allow_module_level=True)

from minitron.core.transformer import TransformerConfig
from minitron.training.argument_groups import build_parser
from minitron.training.arguments_fp8 import FP8_CONFIG_FIELDS

FLAGS = ("--fp8-format", "--fp8-recipe", "--fp8-margin", "--fp8-amax-history-len", "--fp8-amax-compute-algo")
GIVEN = ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-margin", "2",
         "--fp8-amax-history-len", "16", "--fp8-amax-compute-algo", "max"]


def _actions(parser) -> dict:
    return {flag: action for action in parser._actions for flag in action.option_strings if flag in FLAGS}


def test_flags_parse_as_megatrons():
    theirs = _actions(add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False)))
    ours = _actions(build_parser())
    assert set(ours) == set(theirs) == set(FLAGS)
    for flag in FLAGS:
        a, b = ours[flag], theirs[flag]
        assert (a.dest, a.default, list(a.choices or [])) == (b.dest, b.default, list(b.choices or [])), flag
    their_args, _ = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False)).parse_known_args(GIVEN)
    our_args, _ = build_parser().parse_known_args(GIVEN)
    assert {f: getattr(our_args, f) for f in FP8_CONFIG_FIELDS} == {f: getattr(their_args, f) for f in FP8_CONFIG_FIELDS}


def test_config_fields_have_megatron_cores_defaults():
    theirs = {f.name: f.default for f in dataclasses.fields(McoreConfig)}
    ours = {f.name: f.default for f in dataclasses.fields(TransformerConfig)}
    assert {f: ours[f] for f in FP8_CONFIG_FIELDS} == {f: theirs[f] for f in FP8_CONFIG_FIELDS}


def test_expert_rows_padded_as_megatron_pads_them():
    """How many rows an expert's fp8 GEMMs take their rows in multiples of (moe/experts.py pads
    to it): Megatron-Core's own rule, per recipe, and none without fp8."""
    from types import SimpleNamespace

    from megatron.core.transformer.moe.moe_utils import get_align_size_for_quantization as theirs

    from minitron.core.transformer.moe.moe_utils import get_align_size_for_quantization as ours

    for fp8, recipe in ((None, "delayed"), ("hybrid", "delayed"), ("e4m3", "tensorwise"), ("hybrid", "mxfp8")):
        config = SimpleNamespace(fp8=fp8, fp8_recipe=recipe, fp4=None, use_transformer_engine_op_fuser=False)
        assert ours(config) == theirs(config), (fp8, recipe)
