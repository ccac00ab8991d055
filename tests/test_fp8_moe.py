"""fp8 with MoE experts: each expert's fc1 and fc2 multiply with fp8 inputs, with scales of its own.

A small MoE GPT (2 layers, h 64, 4 experts, top-2, all-to-all) takes 3 Adam steps on one fixed
batch, built and stepped by hand on forked gloo ranks (as tests/test_fp8_parallel.py does):
* serial fp8 (hybrid; delayed with a history of 4, "max"; mxfp8) against serial fp32: within
  0.02 of the loss at every step (measured: 1.0e-2 for mxfp8, 5e-3 for delayed);
* --moe-grouped-gemm against SequentialMLP, both fp8 delayed: the same curve, bit for bit. Each
  grouped GEMM casts its expert's rows with that expert's slots, the same casts as the loop's;
  the grouped block pads to the busiest expert's rows, the loop each expert to its own, and
  zero rows change neither an amax nor a sum;
* ep 2 (dp 2 for the dense layers) against serial, fp8 delayed: the first step's loss within
  1e-5 (every scale is still 1; what differs is fp32's order of summation; measured: equal),
  and the curve within 5e-3 (measured: 1.0e-3). It is not the serial curve: Megatron's one amax reduction group pairs
  local expert i of every ep rank (core/fp8_utils.py), so at ep 2 experts 0 and 2 share their
  delayed scales, and 1 and 3 theirs. The test holds that pairing to the serial run's amaxes:
  after the first step, local expert i's fc1 input history on both ranks is the max of serial
  experts i and i + 2;
* a hand-worked sequence of delayed scales for two experts fed inputs of known amaxes, each
  expert its own history; the padding rows (3 rows -> 16) reach fc2 as zeros, bias or not.
"""

from __future__ import annotations

import pytest
import torch

from distributed import run_ranks

VOCAB, SEQ, BATCH, STEPS = 256, 32, 4, 3
FP8 = dict(fp8="hybrid", fp8_recipe="delayed", fp8_amax_history_len=4, fp8_amax_compute_algo="max")


def _fc1_amaxes(model):
    """Per MoE layer, each local expert's fc1 input amax of the newest step."""
    out = []
    for layer in model.decoder.layers:
        experts = layer.mlp.experts
        if hasattr(experts, "local_experts"):
            slots = [e.linear_fc1.__dict__["_fp8_quantizers"] for e in experts.local_experts]
        else:
            slots = experts.linear_fc1.__dict__["_fp8_quantizers"]
        out.append([s["input"].history[0].item() for s in slots])
    return out


def _curve(dp: int = 1, **config):
    """(losses, fc1 input amaxes after the first step) on this rank's part of the one batch."""
    from minitron.core import parallel_state as ps
    from minitron.core.models.gpt import GPTModel
    from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from minitron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, hidden_dropout=0.0,
                               attention_dropout=0.0, num_moe_experts=4, moe_router_topk=2, init_seed=3,
                               moe_token_dispatcher_type="alltoall", **config)
    model_parallel_cuda_manual_seed(5)
    model = GPTModel(config, VOCAB, SEQ)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    ids, labels = (torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(2))
    rank = ps.get_data_parallel_rank()
    rows = slice(rank * BATCH // dp, (rank + 1) * BATCH // dp)
    losses, amaxes = [], None
    for _ in range(STEPS):
        loss = model(ids[rows], torch.arange(SEQ).expand(BATCH // dp, SEQ), labels=labels[rows]).mean()
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():   # what DDP would average: experts over their own replicas
            group = ps.get_data_parallel_group() if getattr(p, "allreduce", True) else \
                ps.get_expert_data_parallel_group()
            if group.size() > 1:
                torch.distributed.all_reduce(p.grad, group=group)
                p.grad /= group.size()
        optimizer.step()
        if dp > 1:
            torch.distributed.all_reduce(loss := loss.detach(), group=ps.get_data_parallel_group())
            loss /= dp
        losses.append(loss.item())
        amaxes = amaxes or (_fc1_amaxes(model) if config.fp8_recipe == "delayed" and config.fp8 else None)
    return losses, amaxes


def _hand_worked(rank):
    """Two experts (3 and 5 rows) through three delayed steps and one tensorwise step; the
    rows that reach each expert's fc2."""
    import minitron.core.transformer.moe.experts as experts_module
    from minitron.core.fp8_utils import get_fp8_context
    from minitron.core.transformer.moe.experts import SequentialMLP
    from minitron.core.transformer.transformer_config import TransformerConfig

    fc2_inputs, plain = [], experts_module.expert_linear

    def spy(x, weight, bias, slots):
        fc2_inputs.append(x.detach().clone())
        return plain(x, weight, bias, slots)

    out = {}
    for recipe, amaxes in (("delayed", [(2.0, 8.0), (4.0, 1.0), (1.0, 0.5)]), ("tensorwise", [(2.0, 8.0)])):
        config = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4, num_moe_experts=2,
                                   ffn_hidden_size=32, init_seed=3, fp8="hybrid", fp8_recipe=recipe,
                                   fp8_amax_history_len=2, fp8_amax_compute_algo="max")
        mlp = SequentialMLP(2, config, 1, [0, 1])
        for expert in mlp.local_experts:   # a bias would make a padding row act(b1) were it not zeroed
            torch.nn.init.constant_(expert.linear_fc1.bias, 3.0)
        scales = []
        for a0, a1 in amaxes:
            x = torch.randn(8, 32, generator=torch.Generator().manual_seed(len(scales)))
            x[:3] *= a0 / x[:3].abs().max()
            x[3:] *= a1 / x[3:].abs().max()
            experts_module.expert_linear = spy
            try:
                with get_fp8_context(config):
                    output, _ = mlp(x, torch.tensor([3, 5]))
            finally:
                experts_module.expert_linear = plain
            output.sum().backward()
            scales.append([e.linear_fc1.__dict__["_fp8_quantizers"]["input"].scale.item() for e in mlp.local_experts])
        out[recipe] = scales
    out["fc2_inputs"] = fc2_inputs[1::2][:2]   # the first step's: fc1, fc2 for expert 0, then expert 1
    return out


@pytest.fixture(scope="module")
def serial():
    """fp32, fp8 delayed, the same with the grouped GEMM, mxfp8; the hand-worked sequence."""
    return run_ranks(lambda rank: [_curve(), _curve(**FP8), _curve(moe_grouped_gemm=True, **FP8),
                                   _curve(fp8="hybrid", fp8_recipe="mxfp8"), _hand_worked(rank)], world_size=1)[0]


def test_fp8_moe_loss_follows_fp32(serial):
    fp32, delayed, mx = (torch.tensor(serial[i][0]) for i in (0, 1, 3))
    assert fp32[-1] < fp32[0] - 0.5                          # it learns
    for curve in (delayed, mx):
        assert not torch.equal(fp32, curve)                  # fp8 did quantize
        torch.testing.assert_close(curve, fp32, rtol=0, atol=0.02)


def test_grouped_gemm_is_the_loop_in_fp8(serial):
    (sequential, seq_amax), (grouped, grouped_amax) = serial[1], serial[2]
    assert sequential == grouped and seq_amax == grouped_amax


def test_ep2_pairs_local_experts_scales(serial):
    losses, amaxes = serial[1]
    ranks = run_ranks(lambda rank: _curve(dp=2, **FP8), world_size=2, ep=2)
    for rank, (ep_losses, ep_amaxes) in enumerate(ranks):
        assert abs(ep_losses[0] - losses[0]) < 1e-5
        torch.testing.assert_close(torch.tensor(ep_losses), torch.tensor(losses), rtol=0, atol=5e-3)
        for layer, serial_layer in zip(ep_amaxes, amaxes):
            paired = [max(serial_layer[i], serial_layer[i + 2]) for i in range(2)]
            assert layer == pytest.approx(paired, rel=1e-6), f"rank {rank}: {layer} vs {serial_layer}"


def test_per_expert_delayed_scales_by_hand(serial):
    hand = serial[4]
    # newest-first histories of 2, "max": scale = 448 / max(history), e4m3 inputs
    # expert 0 sees amaxes 2, 4, 1: [2, 0] -> 224, [4, 2] -> 112, [1, 4] -> 112
    # expert 1 sees amaxes 8, 1, 0.5: [8, 0] -> 56, [1, 8] -> 56, [0.5, 1] -> 448
    torch.testing.assert_close(torch.tensor(hand["delayed"]), torch.tensor([[224.0, 56.0], [112.0, 56.0],
                                                                           [112.0, 448.0]]), rtol=1e-6, atol=0)
    assert hand["tensorwise"][0] == pytest.approx([224.0, 56.0], rel=1e-6)   # this cast's own amax
    for rows, fc2_input in zip((3, 5), hand["fc2_inputs"]):
        assert fc2_input.shape[0] == 16                      # padded to a multiple of 16 rows
        assert fc2_input[:rows].abs().min() > 0 and not fc2_input[rows:].any()
