"""Sliding-window attention (--window-size, --window-attn-skip-freq): the band each query sees,
which layers use it, and a model whose outputs depend on exactly the tokens in the window.
tests/test_mcore_peer.py holds the logits against Megatron-Core's (marked mcore)."""

from __future__ import annotations

import torch

from distributed import run_ranks
from minitron.core.transformer.utils import get_sliding_window_causal_mask, is_layer_window_attention
from minitron.training.arguments_ranges import layer_pattern


def test_the_mask_hides_all_but_the_band():
    hidden = get_sliding_window_causal_mask(5, 5, (2, 0))
    seen = [[j for j in range(5) if not hidden[i, j]] for i in range(5)]
    assert seen == [[0], [0, 1], [0, 1, 2], [1, 2, 3], [2, 3, 4]]       # itself and 2 back
    assert torch.equal(get_sliding_window_causal_mask(5, 5, (-1, 0)),  # no left limit: causal
                       torch.ones(5, 5, dtype=torch.bool).triu(1))
    ahead = get_sliding_window_causal_mask(4, 4, (0, 1))
    assert [[j for j in range(4) if not ahead[i, j]] for i in range(4)] == [[0, 1], [1, 2], [2, 3], [3]]


def test_which_layers_use_the_window():
    assert [is_layer_window_attention((4, 0), 2, n) for n in (1, 2, 3, 4)] == [True, False, True, False]
    assert [is_layer_window_attention((4, 0), [1, 0, 0], n) for n in (1, 2, 3)] == [True, False, False]
    assert is_layer_window_attention((4, 0), None, 7) and not is_layer_window_attention(None, 2, 1)
    assert layer_pattern("([1]*3+[0])*2") == [1, 1, 1, 0] * 2 and layer_pattern("4") == 4


def _outputs(rank):
    """Logits of a 1-layer model for a sequence and for the same sequence with token 0 changed."""
    from minitron.core.models.gpt import GPTModel
    from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from minitron.core.transformer import TransformerConfig

    torch.set_num_threads(1)   # run_ranks has built the groups (tp 1)
    model_parallel_cuda_manual_seed(1)
    ids = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[0, 0] = (ids[0, 0] + 1) % 64
    out = {}
    for name, window in (("full", None), ("window-2", (2, 0)), ("window-8", (8, 0))):
        config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2, hidden_dropout=0.0,
                                   attention_dropout=0.0, window_size=window, init_seed=3)
        # Learned positions would carry token 0's change nowhere else; rope keeps the test to attention.
        model = GPTModel(config, 64, 8, position_embedding_type="rope").eval()
        positions = torch.arange(8).expand(1, 8)
        with torch.no_grad():
            out[name] = (model(ids, positions, None), model(changed, positions, None))
    return out


def test_a_position_depends_only_on_the_tokens_in_its_window():
    out = run_ranks(_outputs, world_size=1)[0]
    moved = {name: ((a - b).abs().amax(dim=-1)[0] > 0).tolist() for name, (a, b) in out.items()}
    # Token 0 reaches every later position through full attention; through a window of 2 back
    # only positions 0, 1 and 2 (one layer: no second hop carries it further).
    assert moved["full"] == [True] * 8
    assert moved["window-2"] == [True, True, True] + [False] * 5
    assert torch.equal(out["window-8"][0], out["full"][0])   # a window as long as the sequence is no window
