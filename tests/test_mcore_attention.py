"""minitron's position embeddings against Megatron-Core 0.19.2's own (marked mcore).

Two yardsticks: the table of rope angles (RotaryEmbedding.forward) for every knob Megatron
has, compared entry by entry over 4096 positions, where a wrong constant in Llama 3.1's
scaling would show even though 8 tokens barely turn the slow channels; and the logits of
the whole model from the same weights, for each --position-embedding-type minitron builds.
The fixture and the Megatron twin are test_mcore_peer.py's.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.mcore
try:
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding as McoreRotary
except ImportError as exc:
    pytest.skip(f"megatron.core does not import ({exc}): see tests/test_mcore_peer.py", allow_module_level=True)

from test_mcore_peer import BATCH, SEQ, SHAPE, TOL, VOCAB, _megatron_twin, one_rank  # noqa: F401 (a fixture)

from minitron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from minitron.core.models.gpt import GPTModel
from minitron.core.transformer import TransformerConfig

ROTARY = {  # name: RotaryEmbedding's keyword arguments, both libraries' names
    "plain": {},
    "percent": dict(rotary_percent=0.5),
    "interleaved": dict(rotary_interleaved=True),
    "base": dict(rotary_base=500000),
    "interpolation": dict(seq_len_interpolation_factor=4),
    # base 500000 puts the 64 channels' wavelengths on all three sides of Llama 3.1's band
    "llama3.1-scaling": dict(rotary_base=500000, rope_scaling=True, rope_scaling_factor=8.0),
    "scaling-factor-32": dict(rotary_base=500000, rope_scaling=True, rope_scaling_factor=32.0),
}


@pytest.mark.parametrize("name", list(ROTARY))
def test_rope_angles_equal_megatron_cores(one_rank, name):
    kwargs = ROTARY[name]
    ours = RotaryEmbedding(64, **{"rotary_percent": 1.0, **kwargs})(4096)
    theirs = McoreRotary(64, **{"rotary_percent": 1.0, **kwargs}, use_cpu_initialization=True)(4096)
    assert ours.shape == theirs.shape
    assert torch.equal(ours, theirs), f"{name}: angles differ by {(ours - theirs).abs().max():.2e}"


POSITIONS = {  # name: (TransformerConfig fields both take, GPTModel arguments both take)
    "learned_absolute": ({}, {}),
    "none": ({}, dict(position_embedding_type="none")),
    "rope": ({}, dict(position_embedding_type="rope")),
    "rope-interleaved": (dict(rotary_interleaved=True), dict(position_embedding_type="rope")),
    "rope-percent-base": ({}, dict(position_embedding_type="rope", rotary_percent=0.5, rotary_base=100)),
    "rope-interpolation": ({}, dict(position_embedding_type="rope", seq_len_interpolation_factor=2)),
    "rope-llama3.1-scaling": ({}, dict(position_embedding_type="rope", rotary_base=500000, rope_scaling=True,
                                       rope_scaling_factor=16.0)),
}


@pytest.mark.parametrize("name", list(POSITIONS))
def test_logits_equal_megatron_cores_for_each_position_option(one_rank, name):
    fields, model_args = POSITIONS[name]
    config = TransformerConfig(**SHAPE, **fields, init_seed=3)
    model = GPTModel(config, VOCAB, SEQ, share_embeddings_and_output_weights=True, **model_args).eval()
    with torch.no_grad():   # biases start at 0, norms at 1: nudge them so every path counts
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(param.numel())) * 0.1)
    twin = _megatron_twin(fields, model_args, model.state_dict())
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(SEQ).expand(BATCH, SEQ)
    causal = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1).expand(BATCH, 1, SEQ, SEQ)
    with torch.no_grad():
        ours, theirs = model(ids, positions, causal), twin(ids, positions, causal)
    diff = (ours - theirs).abs().max().item()
    assert diff <= TOL, f"{name}: logits differ from Megatron-Core 0.19.2's by {diff:.2e}"


# --- GQA with fewer groups than tensor-parallel ranks: two ranks, both libraries ---------------
def _gqa_rank(rank: int, port: int, out) -> None:
    """One of two spawned ranks: minitron's tp-2 GPT with 1 key/value group, its shard loaded
    into Megatron-Core's tp-2 GPT; this rank's vocabulary-parallel logits from each."""
    import torch.distributed as dist
    from megatron.core import parallel_state as mcore_ps
    from megatron.core import tensor_parallel as mcore_tp
    from megatron.core.models.gpt import GPTModel as McoreGPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel import random as mcore_random
    from megatron.core.transformer.transformer_config import TransformerConfig as McoreConfig

    from minitron.core import parallel_state
    from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed

    torch.set_num_threads(1)
    torch.cuda.current_device = lambda: "cpu"                      # as test_mcore_peer's fixture
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    torch.cuda.manual_seed = torch.manual_seed
    mcore_random._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mcore_random._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    mcore_ps.initialize_model_parallel(2, 1)
    parallel_state.initialize_model_parallel(2, 1)
    mcore_tp.model_parallel_cuda_manual_seed(5)
    model_parallel_cuda_manual_seed(5)
    fields = dict(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=1, ffn_hidden_size=64,
                  hidden_dropout=0.0, attention_dropout=0.0, tensor_model_parallel_size=2)
    ours = GPTModel(TransformerConfig(**fields, init_seed=3), VOCAB, SEQ, position_embedding_type="rope").eval()
    with torch.no_grad():
        for name, param in ours.named_parameters():   # the same nudge on every rank's slice of it
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(param.numel())) * 0.1)
    config = McoreConfig(**fields, use_cpu_initialization=True, params_dtype=torch.float32)
    twin = McoreGPTModel(config, get_gpt_layer_local_spec(), vocab_size=VOCAB, max_sequence_length=SEQ,
                         position_embedding_type="rope").eval()
    missing, unexpected = twin.load_state_dict(ours.state_dict(), strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing), (missing, unexpected)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(SEQ).expand(BATCH, SEQ)
    causal = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1).expand(BATCH, 1, SEQ, SEQ)
    with torch.no_grad():
        out[rank] = (ours(ids, positions, causal) - twin(ids, positions, causal)).abs().max().item()
    dist.destroy_process_group()


def test_gqa_with_fewer_groups_than_tp_ranks_equals_megatron_cores():
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.get_context("spawn").Manager().dict()
    mp.start_processes(_gqa_rank, args=(port, out), nprocs=2, start_method="spawn")
    assert dict(out).keys() == {0, 1}
    assert max(out.values()) <= TOL, f"tp 2, 1 key/value group: logits differ from Megatron-Core's by {dict(out)}"
