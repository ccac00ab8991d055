"""minitron's fsdp_dtensor checkpoint held against Megatron-Core 0.19.2 (marked mcore).

Megatron's own fsdp_dtensor reader cannot run here: it loads into Megatron-FSDP's DTensors,
and Megatron-FSDP allocates its buffers and streams on CUDA (megatron_fsdp.py makes
torch.cuda.Stream()s and checks its device against cuda:current_device). What runs on the CPU
is the rest of its load path, and that is what this holds:

1. the llama case of test_mcore_peer.py (SwiGLU, grouped-query attention, RMSNorm, rope,
   untied output) is saved by minitron's Megatron-FSDP at dp 2 (optim_grads_params, so the
   shards cut parameters, between rows) on two forked ranks;
2. every key Megatron's GPTModel asks for under Megatron's fsdp_dtensor names
   (``model.module.<name>``, SwiGLU's fc1 as ``_w`` / ``_v``, handle_swiglu_in_state_dict's),
   flattened by Megatron's own flatten_state_dict as its loader does, is in the checkpoint;
3. torch's DCP reads those keys into whole tensors, Megatron's model takes them (fc1 joined
   as [gate; up]), and its logits are minitron's (1e-5, as test_mcore_peer.py).
"""

from __future__ import annotations

import re

import pytest
import torch

from test_mcore_peer import BATCH, CASES, SEQ, SHAPE, TOL, VOCAB, one_rank  # noqa: F401 -- the fixture

pytestmark = pytest.mark.mcore
import torch.distributed.checkpoint as dcp   # noqa: E402
from megatron.core.models.gpt import GPTModel as McoreGPTModel   # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec   # noqa: E402
from megatron.core.transformer.fsdp_dtensor_checkpoint import flatten_state_dict   # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig as McoreConfig   # noqa: E402

from minitron.core.models.gpt import GPTModel   # noqa: E402
from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed   # noqa: E402
from minitron.core.transformer import TransformerConfig   # noqa: E402

FC1 = re.compile(r"\.mlp\.linear_fc1\.weight$")


@pytest.fixture(scope="module")
def saved_by_fsdp(tmp_path_factory):
    """minitron's llama at dp 2 under Megatron-FSDP, saved as fsdp_dtensor: (checkpoint, logits).
    A module fixture, so that it forks before the test's one-rank groups start in this process."""
    from distributed import run_ranks

    where = tmp_path_factory.mktemp("fsdp_dtensor")
    fields, model_args = CASES["llama"]

    def body(rank):
        from minitron.core import dist_checkpointing
        from minitron.core.distributed.fsdp import FullyShardedDataParallel
        from minitron.training.checkpointing_fsdp_dtensor import _model_entries

        model_parallel_cuda_manual_seed(5)
        ours = GPTModel(TransformerConfig(**SHAPE, **fields, init_seed=3), VOCAB, SEQ, **model_args).eval()
        with torch.no_grad():   # every weight off its initial value (norms start at 1)
            for name, param in ours.named_parameters():
                gen = torch.Generator().manual_seed(sum(map(ord, name)) * 31 + param.numel())
                param.add_(torch.randn(param.shape, generator=gen) * 0.1)
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            logits = ours(ids, torch.arange(SEQ).expand(BATCH, SEQ), None)
        fsdp = FullyShardedDataParallel(ours.config, ours, "optim_grads_params")
        dist_checkpointing.save({"model": _model_entries([fsdp], writing=True)}, where)
        return logits
    logits = run_ranks(body, world_size=2)
    assert torch.equal(logits[0], logits[1])
    return where, logits[0]


def test_megatron_core_finds_and_reads_every_weight(saved_by_fsdp, one_rank):
    where, logits = saved_by_fsdp
    fields, model_args = CASES["llama"]
    config = McoreConfig(**SHAPE, **fields, use_cpu_initialization=True, params_dtype=torch.float32)
    spec = get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm, normalization=config.normalization)
    theirs = McoreGPTModel(config, spec, vocab_size=VOCAB, max_sequence_length=SEQ, **model_args).eval()
    wanted = {}   # Megatron-FSDP's state dict keys for this model, as its loader asks for them
    for name, param in theirs.named_parameters():
        if FC1.search(name):
            gate, up = torch.empty_like(param).chunk(2)
            wanted[f"module.{name}_w"], wanted[f"module.{name}_v"] = gate, up
        else:
            wanted[f"module.{name}"] = torch.empty_like(param)
    metadata = dcp.FileSystemReader(str(where)).read_metadata().state_dict_metadata
    # Megatron's loader flattens what it asks for with this and compares it with the metadata's
    # keys (print_diff_in_state_dicts); DCP then reads the keys it asked for
    asked = set(flatten_state_dict({"model": wanted}))
    assert asked <= set(metadata), sorted(asked - set(metadata))
    state = {"model": wanted}
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(where)))
    read = {}
    for key, value in state["model"].items():
        name = key[len("module."):]
        if name.endswith("_v"):
            continue
        if name.endswith("_w"):
            name, value = name[:-2], torch.cat([value, state["model"][f"module.{name[:-2]}_v"]])
        read[name] = value
    missing, unexpected = theirs.load_state_dict(read, strict=False)
    assert not unexpected and all(key.endswith("_extra_state") for key in missing), (missing, unexpected)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    causal = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1).expand(BATCH, 1, SEQ, SEQ)
    with torch.no_grad():
        diff = (theirs(ids, torch.arange(SEQ).expand(BATCH, SEQ), causal) - logits).abs().max().item()
    assert diff <= TOL, f"Megatron-Core's logits from minitron's fsdp_dtensor weights differ by {diff:.2e}"
