"""GroupedMLP (--moe-grouped-gemm): this rank's experts as one batched matmul.

SequentialMLP runs its E_local experts one after the other, E_local small matrix products per
linear layer; on a GPU each is a kernel launch too small to fill the device. Megatron's grouped
GEMM runs them as one. Here the same idea in plain torch: the rows of each expert, padded with
zero rows to the busiest expert's count, make one [E_local, rows, h] tensor, and the experts'
weights one [E_local, ffn, h] stack; torch.bmm multiplies all of them at once. The padding rows
are cut off after fc2, so they change nothing: the same products as SequentialMLP's, in one call.

The parameters are Megatron's TEGroupedMLP's: ``linear_fc1.weight0``, ``linear_fc1.weight1``, ...
(one per local expert, each drawn exactly as SequentialMLP draws that expert's), so a run gives
the same numbers with and without --moe-grouped-gemm. A torch_dist checkpoint stores them as
SequentialMLP stores its experts (one tensor per linear with an axis of all experts), so the two
are interchangeable, as Megatron's are: save with the grouped GEMM, resume without it, at
another ep. Gated (--swiglu), each weight{i} of fc1 is that expert's [gate | up], cut by expert
tp with stride 2 as SequentialMLP's is, and the gating runs on the last dimension of the whole
block.

Under --fp8-format each local expert's GEMM gets slots of its own (TE's GroupedLinear keeps
scales per GEMM): its input rows, its weight and its output gradient are cast apart, then
multiplied (core/fp8/linear.py), the same casts and products as SequentialMLP's experts. The
block's rows are rounded up to a multiple of 16 (mxfp8: 32), Megatron's padding of every
expert (experts.py), and the rows past an expert's count are zeroed again before fc2.
"""

from __future__ import annotations

import torch

from minitron.core.fp8_utils import fp8_quantizers
from minitron.core.transformer.mlp import mlp_activation
from minitron.core.transformer.module import MegatronModule
from minitron.core.transformer.moe.experts import ExpertMLP, expert_init_rng, expert_linear, expert_sharded_offsets
from minitron.core.transformer.moe.moe_utils import get_align_size_for_quantization
from minitron.core.transformer.utils import make_sharded_tensors_for_checkpoint
from minitron.trace import traced
from minitron.trace.recorder import short_value


class _GroupedLinear(torch.nn.Module):
    """weight0..weight{E_local-1} (and bias0..) of one linear layer of every local expert."""

    def __init__(self, linears):
        super().__init__()
        for i, linear in enumerate(linears):
            self.register_parameter(f"weight{i}", linear.weight)
            self.register_parameter(f"bias{i}", linear.bias)
        self.num_gemms = len(linears)

    def forward(self, x):
        """x [E_local, rows, in] -> [E_local, rows, out]: one batched product, then the biases."""
        slots = fp8_quantizers(self, self.num_gemms)
        if slots is not None:   # fp8: each expert's GEMM with its own casts
            return torch.stack([expert_linear(x[i], getattr(self, f"weight{i}"), getattr(self, f"bias{i}"), slots[i])
                                for i in range(self.num_gemms)])
        weights = torch.stack([getattr(self, f"weight{i}") for i in range(self.num_gemms)])
        out = torch.bmm(x, weights.transpose(1, 2))
        if self.bias0 is not None:
            out = out + torch.stack([getattr(self, f"bias{i}") for i in range(self.num_gemms)]).unsqueeze(1)
        return out


class GroupedMLP(MegatronModule):
    def __init__(self, num_local_experts: int, config, layer_number: int, local_expert_indices: list[int]):
        super().__init__(config)
        ffn = config.moe_ffn_hidden_size or config.ffn_hidden_size
        experts = []
        for index in local_expert_indices:   # the same draws as SequentialMLP's
            with expert_init_rng(config, layer_number, index):
                experts.append(ExpertMLP(config, ffn))
        self.linear_fc1 = _GroupedLinear([e.linear_fc1 for e in experts])
        self.linear_fc2 = _GroupedLinear([e.linear_fc2 for e in experts])
        self.activation_func = mlp_activation(config)   # gated: [E_local, rows, 2 x ffn] halves
        self.num_local_experts = num_local_experts

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        """weight{i} of each linear as SequentialMLP keys its expert i: slice ``first + i`` of the
        expert axis of ``experts.<linear>.weight`` (Megatron-Core's TEGroupedMLP does the same,
        so its grouped and sequential checkpoints read each other)."""
        out = {}
        for name in ("linear_fc1", "linear_fc2"):
            key = f"{prefix}experts.{name}."
            for i in range(self.num_local_experts):
                offsets = expert_sharded_offsets(sharded_offsets, self.num_local_experts, i)
                for kind in ("weight", "bias"):
                    tensor = getattr(getattr(self, name), f"{kind}{i}")
                    if tensor is not None:   # the marks (expert, tp slice, stride) say how to cut it
                        sharded = make_sharded_tensors_for_checkpoint({kind: tensor}, key, offsets)
                        out[f"{prefix}{name}.{kind}{i}"] = sharded[key + kind]
        return out

    @traced(args=lambda self, permuted_local_hidden_states, tokens_per_expert: {
        "tokens": short_value(permuted_local_hidden_states),
        "tokens_per_expert": tokens_per_expert.tolist()})
    def forward(self, permuted_local_hidden_states, tokens_per_expert):
        """Rows grouped by local expert -> the same rows' outputs, in the same order."""
        x, counts = permuted_local_hidden_states, tokens_per_expert.tolist()   # host counts
        # Expert e's rows go to [e, :counts[e]] of a zero-padded [E_local, max, h] block.
        expert_of_row = torch.repeat_interleave(torch.arange(len(counts), device=x.device),
                                                torch.tensor(counts, device=x.device))
        slot_of_row = torch.cat([torch.arange(n, device=x.device) for n in counts])
        align = get_align_size_for_quantization(self.config)
        rows = -(-max(counts + [1]) // align) * align if align else max(counts + [1])
        block = x.new_zeros(len(counts), rows, x.shape[-1]).index_put((expert_of_row, slot_of_row), x)
        hidden = self.activation_func(self.linear_fc1(block))
        if align:   # fp8: a row past its expert's count enters fc2 as zeros (experts.py)
            hidden = hidden.new_zeros(hidden.shape).index_put((expert_of_row, slot_of_row),
                                                              hidden[expert_of_row, slot_of_row])
        out = self.linear_fc2(hidden)
        return out[expert_of_row, slot_of_row], None
