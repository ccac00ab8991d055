"""Megatron's torch_dist checkpoint: a model saved at one layout is read by another.

A GPT with SwiGLU (fc1's [gate | up] halves, a ShardedTensorFactory) and grouped-query
attention is saved at tp 2 x pp 2 (4 forked ranks) and loaded by one rank: every weight equals
the serial model's. (Training runs resumed at other layouts: test_dist_ckpt_resume.py, stress.)
The sharded state dict's keys do not depend on the layout; DCP's files are what a torch_dist
checkpoint holds; `minitron ckpt inspect` reads them, and refuses a damaged one in one line.
"""

from __future__ import annotations

import pytest
import torch

from distributed import run_ranks
from minitron.core import dist_checkpointing, parallel_state
from minitron.core.models.gpt import GPTModel
from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
from minitron.core.transformer import TransformerConfig

SIZES = dict(num_layers=2, hidden_size=16, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=32,
             gated_linear_unit=True)
VOCAB, SEQ = 64, 8


def build(tp: int, pp: int, seed: int) -> GPTModel:
    torch.set_num_threads(1)
    config = TransformerConfig(**SIZES, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                               activation_func=torch.nn.functional.silu, init_seed=seed)
    model_parallel_cuda_manual_seed(seed)
    return GPTModel(config, VOCAB, SEQ, pre_process=parallel_state.is_pipeline_first_stage(),
                    post_process=parallel_state.is_pipeline_last_stage())


def _weights(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def save_at(tp: int, pp: int, where, world: int = 4):
    def body(rank):
        model = build(tp, pp, seed=1)
        dist_checkpointing.save(model.sharded_state_dict(), where, {"iteration": 7})
        return sorted({sh.key for sh in model.sharded_state_dict().values()})
    return run_ranks(body, world_size=world, tp=tp, pp=pp)


def load_serially(where) -> tuple[dict, dict]:
    """One rank: the serial model's own weights (seed 1), and a model of other weights (seed
    99) after it read the checkpoint."""
    def body(rank):
        serial = _weights(build(1, 1, seed=1))
        model = build(1, 1, seed=99)
        dist_checkpointing.load(model.sharded_state_dict(), where)
        return serial, _weights(model)
    return run_ranks(body, world_size=1)[0]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    where = tmp_path_factory.mktemp("dist_ckpt")
    return where, save_at(2, 2, where)


def test_files_are_dcps(saved):
    where, keys = saved
    names = sorted(p.name for p in where.iterdir())
    assert names == [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp",
                     "common.pt", "metadata.json"]
    # The layers' keys carry no layer number: both stages write slices of one tensor.
    assert "decoder.layers.self_attention.linear_qkv.weight" in keys[0] + keys[2]


def test_tp2_pp2_checkpoint_loads_at_tp1_pp1(saved):
    serial, loaded = load_serially(saved[0])
    assert loaded.keys() == serial.keys()
    for key, value in serial.items():
        assert torch.equal(loaded[key], value), key


def test_ckpt_inspect_names_each_chunk_and_its_writer(saved):
    from cli_here import minitron_here   # the CLI in this process: inspect starts no rank

    done = minitron_here("ckpt", "inspect", saved[0], "--match", "decoder.layers.mlp.linear_fc1.weight")
    assert done.returncode == 0, done.stderr
    # SwiGLU's fc1 at tp 2 x pp 2: each of 4 ranks wrote its gate and its up half, 8 chunks of (2, 64, 16).
    assert "8 chunks of 1 tensor shown" in done.stdout
    assert done.stdout.count("2×64×16") == 8 and "__3_0.distcp" in done.stdout


def test_ckpt_inspect_refuses_what_is_not_a_checkpoint(tmp_path):
    from cli_here import minitron_here   # the CLI in this process: a refusal starts no rank

    done = minitron_here("ckpt", "inspect", tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "holds no checkpoint" in done.stderr


def _resumable_copy(saved_dir, root):
    """The fixture's checkpoint as a --save directory would hold it: iter_0000001 and a
    metadata.json that lists every file's size and sha256 (what save_checkpoint_dist writes)."""
    import json
    import shutil

    from minitron.training.checkpoint_files import TRACKER, file_digest

    where = root / "iter_0000001"
    shutil.copytree(saved_dir, where)
    meta = json.loads((where / "metadata.json").read_text())
    meta.update(iteration=1, files={p.name: {"bytes": p.stat().st_size, "sha256": file_digest(p)}
                                    for p in sorted(where.iterdir()) if p.name != "metadata.json"})
    (where / "metadata.json").write_text(json.dumps(meta))
    (root / TRACKER).write_text("1")
    return where, meta


def _restamp(where, meta, name):
    """What an attacker who can write the directory does: the checksum follows the new bytes."""
    import json

    from minitron.training.checkpoint_files import file_digest

    path = where / name
    meta["files"][name] = {"bytes": path.stat().st_size, "sha256": file_digest(path)}
    (where / "metadata.json").write_text(json.dumps(meta))


def test_a_damaged_torch_dist_checkpoint_is_one_line(saved, tmp_path):
    import pickle

    from cli_here import minitron_here   # the CLI in this process: a refusal starts no rank

    where, meta = _resumable_copy(saved[0], tmp_path / "ck")
    shard = bytearray((where / "__1_0.distcp").read_bytes())
    shard[100] ^= 1
    (where / "__1_0.distcp").write_bytes(bytes(shard))
    done = minitron_here("ckpt", "inspect", tmp_path / "ck")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "sha256" in done.stderr, done.stderr
    # DCP unpickles .metadata with pickle.load: a planted one would run code. Refused unread.
    where, meta = _resumable_copy(saved[0], tmp_path / "planted")
    (where / ".metadata").write_bytes(pickle.dumps(print))
    _restamp(where, meta, ".metadata")
    done = minitron_here("ckpt", "inspect", tmp_path / "planted")
    assert done.returncode == 2 and "builtins.print, which is not DCP's metadata" in done.stderr, done.stderr


# --- MoE: the experts as Megatron-Core stores them (test_dist_ckpt_mcore.py holds them to it) ---
MOE_SIZES = dict(num_moe_experts=4, moe_router_topk=2)
EXPERT_FC1 = "decoder.layers.mlp.experts.experts.linear_fc1.weight"


def build_moe(seed: int, grouped: bool = False) -> GPTModel:
    torch.set_num_threads(1)
    config = TransformerConfig(**SIZES, **MOE_SIZES, moe_grouped_gemm=grouped, init_seed=seed,
                               activation_func=torch.nn.functional.silu)
    model_parallel_cuda_manual_seed(seed)
    return GPTModel(config, VOCAB, SEQ)


def _load_moe_serially(where) -> tuple[dict, dict]:
    def body(rank):
        serial = _weights(build_moe(seed=1))
        model = build_moe(seed=99)
        model.load_state_dict(dist_checkpointing.load(model.sharded_state_dict(), where), strict=True)
        return serial, _weights(model)
    return run_ranks(body, world_size=1)[0]


def _assert_same(serial: dict, loaded: dict):
    assert loaded.keys() == serial.keys()
    for key, value in serial.items():
        assert torch.equal(loaded[key], value), key


def test_grouped_experts_saved_at_ep2_load_serially_as_sequential_ones(tmp_path):
    """Expert-parallel rank 1's weight0 and weight1 are slices 2 and 3 of the expert axis."""
    def body(rank):
        model = build_moe(seed=1, grouped=True)
        dist_checkpointing.save(model.sharded_state_dict(), tmp_path)
        return {sh.key: sh.global_shape for sh in model.sharded_state_dict().values() if hasattr(sh, "global_shape")}
    shapes = run_ranks(body, world_size=2, ep=2)[0]
    # (layers, experts, [gate | up] of 2 x 32, h): one tensor for all four experts, as Megatron-Core's
    assert shapes[EXPERT_FC1] == (2, 4, 64, 16) and not any("local_experts" in key for key in shapes)
    _assert_same(*_load_moe_serially(tmp_path))


def test_an_earlier_minitron_moe_checkpoint_still_loads(tmp_path):
    """Before issue 35 minitron keyed each expert by its global index (no expert axis) and kept
    an MoE layer's norms under their module names; such a checkpoint is read under today's keys."""
    from minitron.core.dist_checkpointing import ShardedTensor

    def body(rank):
        model = build_moe(seed=1)
        def changed(name):   # the experts and the MoE layers' norms (every layer is one here)
            return name.startswith("decoder.layers.") and (".local_experts." in name or "layernorm." in name)
        earlier = {name: sh for name, sh in model.sharded_state_dict().items() if not changed(name)}
        num_layers = SIZES["num_layers"]
        for name, param in model.state_dict().items():   # described as the earlier version did
            if changed(name):
                layer, rest = name.removeprefix("decoder.layers.").split(".", 1)
                earlier[name] = ShardedTensor.from_rank_offsets(
                    f"decoder.layers.{rest}", param, (0, int(layer), num_layers), prepend_axis_num=1)
        dist_checkpointing.save(earlier, tmp_path)
        return sorted(sh.key for sh in earlier.values())
    keys = run_ranks(body, world_size=1)[0]
    assert "decoder.layers.mlp.experts.local_experts.3.linear_fc2.weight" in keys and EXPERT_FC1 not in keys
    assert "decoder.layers.pre_mlp_layernorm.weight" in keys
    _assert_same(*_load_moe_serially(tmp_path))


MLA_SIZES = dict(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64,
                 multi_latent_attention=True, kv_lora_rank=12, qk_head_dim=8, qk_pos_emb_head_dim=4,
                 v_head_dim=6, q_lora_rank=10, normalization="RMSNorm")


def build_mla(seed: int) -> GPTModel:
    torch.set_num_threads(1)
    model_parallel_cuda_manual_seed(seed)
    return GPTModel(TransformerConfig(**MLA_SIZES, init_seed=seed), VOCAB, SEQ, position_embedding_type="rope")


def test_an_mla_layer_keeps_its_norm_names_and_an_earlier_checkpoint_still_loads(tmp_path):
    """Megatron's MLA layer spec keeps ``input_layernorm.``/``pre_mlp_layernorm.`` (only its dense
    spec renames them after TE's fused layers; tests/test_mcore_mla.py holds the keys against it).
    Earlier minitron renamed them as a dense layer's: such a checkpoint is read under today's keys."""
    from dataclasses import replace

    def body(rank):
        model = build_mla(seed=1)
        today = sorted(sh.key for sh in model.sharded_state_dict().values())
        renamed = {".input_layernorm.": ".self_attention.linear_qkv.layer_norm_",
                   ".pre_mlp_layernorm.": ".mlp.linear_fc1.layer_norm_"}
        earlier = {}
        for name, sh in model.sharded_state_dict().items():
            for old, new in renamed.items():
                if sh.key.startswith("decoder.layers.") and old in sh.key:
                    sh = replace(sh, key=sh.key.replace(old, new))
            earlier[name] = sh
        dist_checkpointing.save(earlier, tmp_path)
        serial = _weights(model)
        other = build_mla(seed=99)
        other.load_state_dict(dist_checkpointing.load(other.sharded_state_dict(), tmp_path), strict=True)
        return today, serial, _weights(other)
    today, serial, loaded = run_ranks(body, world_size=1)[0]
    assert "decoder.layers.input_layernorm.weight" in today and "decoder.layers.pre_mlp_layernorm.weight" in today
    _assert_same(serial, loaded)
