"""SequentialMLP: this rank's experts, each an MLP of its own, run one after the other.

An expert is the dense MLP's shape (h -> ffn -> h). Rank j of the expert-parallel group holds
experts [j*E/ep, (j+1)*E/ep); with expert tensor parallelism each of them is split like a
tensor-parallel MLP: fc1 by output columns, fc2 by input rows, so fc2 yields a partial sum that
the dispatcher's reduce-scatter completes (no collective inside the expert).

With --swiglu an expert is gated as the dense MLP is (mlp.py): fc1 makes [gate | up], 2 x ffn
wide, and silu(gate) * up goes into fc2 (Mixtral's and Qwen3-MoE's experts). Each expert-tensor
rank keeps matching slices of both halves (stride 2: pieces r and etp + r of 2 x etp), so the
gating stays elementwise on the slice; the mark ``partition_stride = 2`` tells the checkpoint
(transformer/utils.py's _swiglu_factory) where those two pieces lie in the global [gate | up].

(Megatron has both: GroupedMLP runs all local experts in one grouped GEMM, SequentialMLP loops
over them. The loop reads better and computes the same; --moe-grouped-gemm runs
experts_grouped.GroupedMLP, one batched matmul over the local experts.)

Biases (with --add-bias-linear, Megatron's default) are allowed only with expert-tensor-parallel
size 1, as in Megatron: fc2's output on an expert-tensor-parallel slice is a partial sum, and a
bias added there would be added once per slice. With whole experts, each expert's fc1 and fc2
carry a bias like the dense MLP's (zeros at the start). The routing weight multiplies the whole
expert output, bias included (unpermute applies it): p * (W2 act(W1 x + b1) + b2).

Under --fp8-format (inside the block's fp8 context, core/fp8_utils.py) each expert's fc1 and
fc2 multiply with fp8 inputs as a dense linear does (core/fp8/linear.py), with slots of their
own: per-expert scales for the input, the weight and the output gradient. As Megatron does
(its _pad_tensor_for_quantization, TE's Fp8Padding), an expert's rows are first padded with
zero rows to a multiple of 16 (32 under mxfp8) and the output cut back; the padding rows of
fc2's input are zeroed again after the activation (a bias would make them act(b1); Megatron's
are zero because their routing probability, applied there, is 0). Zero rows raise no amax and
add nothing to a sum, so the padding changes no number; it costs their bytes.

Expert parameters carry ``allreduce = False`` (Megatron's mark). DDP reads it: their gradients
are averaged over the expert-data-parallel group, the ranks holding the *same* experts, not
over the dense data-parallel group.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F

from minitron.core import parallel_state
from minitron.core.fp8.linear import Fp8LinearWithAsyncCommunication
from minitron.core.fp8_utils import fp8_quantizers
from minitron.core.tensor_parallel import divide, get_expert_parallel_rng_tracker_name
from minitron.core.tensor_parallel.weight_init import init_device, initialize_affine_weight
from minitron.core.transformer.mlp import mlp_activation
from minitron.core.transformer.module import MegatronModule
from minitron.core.transformer.moe.moe_utils import get_align_size_for_quantization, pad_rows
from minitron.core.transformer.utils import replace_prefix_for_sharding, sharded_state_dict_default
from minitron.trace import traced
from minitron.trace.recorder import short_value


@contextmanager
def expert_init_rng(config, layer_number: int, expert_index: int):
    """A generator state of its own for each (layer, expert): an expert gets the same weights
    whichever rank builds it and however many experts that rank holds (core/init_rng.py does
    the same for whole layers)."""
    seed = getattr(config, "init_seed", None)
    if seed is None:   # a config built by hand: plain torch behaviour
        yield
        return
    with torch.random.fork_rng(devices=[]):
        # The CPU generator only (torch.manual_seed would reseed the GPU's default stream too,
        # and fork_rng(devices=[]) would not put it back): a GPU rank drawing on the device
        # uses the tracker's expert stream instead.
        torch.default_generator.manual_seed(seed * 10_007 + 1_000_003 * (expert_index + 1) + layer_number)
        yield


def _expert_weight(full_shape, partition_dim: int, init_method, config, stride: int = 1) -> torch.nn.Parameter:
    """This expert-tensor-parallel rank's slice of an expert's weight, drawn as the TP layers
    draw theirs (tensor_parallel/weight_init.py: whole on the CPU, or the slice on the GPU on
    the expert-parallel stream); ``stride`` 2: pieces r and tp + r of 2 x tp, the gated fc1's
    matching gate and up slices."""
    tp = parallel_state.get_expert_tensor_parallel_group()
    shape = list(full_shape)
    shape[partition_dim] = divide(shape[partition_dim], tp.size(), "expert weight")
    weight = torch.nn.Parameter(torch.empty(shape, dtype=config.params_dtype, device=init_device()))
    initialize_affine_weight(weight, config, *full_shape, shape[partition_dim], partition_dim, init_method,
                             stride, rank=tp.rank(), world_size=tp.size(),
                             rng_tracker_name=get_expert_parallel_rng_tracker_name())
    weight.allreduce = False                      # an expert parameter (see the module docstring)
    weight.tensor_model_parallel = tp.size() > 1  # a slice: the grad norm counts it on every slice
    return weight


def _expert_bias(size: int, config) -> torch.nn.Parameter | None:
    """A whole expert's bias (expert tp is 1 whenever there is one: validate_moe), zeros as
    Megatron's linear layers start them."""
    if not config.add_bias_linear:
        return None
    bias = torch.nn.Parameter(torch.zeros(size, dtype=config.params_dtype, device=init_device()))
    bias.allreduce = False
    return bias


def expert_sharded_offsets(sharded_offsets: tuple, num_local_experts: int, local_index: int) -> tuple:
    """The offsets of local expert ``local_index``'s tensors in a checkpoint: one more axis, after
    the layer axis, of all E experts. Megatron-Core stores the experts so (SequentialMLP's and
    TEGroupedMLP's sharded_state_dict): ``mlp.experts.experts.linear_fc1.weight`` is one
    (num_layers, E, ffn, h) tensor, and expert-parallel rank j holds slices [j*E_local,
    (j+1)*E_local) of its expert axis. The key names no expert, so it is the same at any
    expert-parallel size, and a reader at another ep takes other slices of the same tensor."""
    ep, ep_rank = (parallel_state.get_expert_model_parallel_world_size(),
                   parallel_state.get_expert_model_parallel_rank())
    return (*sharded_offsets,
            (len(sharded_offsets), ep_rank * num_local_experts + local_index, ep * num_local_experts))


class ExpertLinear(torch.nn.Module):
    """A linear layer whose weight is this rank's slice of an expert's (and its bias, if any)."""

    def __init__(self, weight: torch.nn.Parameter, bias: torch.nn.Parameter | None = None):
        super().__init__()
        self.weight = weight
        self.bias = bias

    def forward(self, x):
        return expert_linear(x, self.weight, self.bias, fp8_quantizers(self))


def expert_linear(x, weight, bias, fp8_slots):
    """One expert GEMM: with fp8 slots (inside the fp8 context) on fp8 inputs, with no
    collective inside (an expert slice's communication is the dispatcher's); else plain."""
    if fp8_slots is None:
        return F.linear(x, weight, bias)
    return Fp8LinearWithAsyncCommunication.apply(x, weight, bias, fp8_slots, False, False, None)


class ExpertMLP(MegatronModule):
    def __init__(self, config, ffn_hidden_size: int):
        super().__init__(config)
        # --moe-latent-size: the experts run in the latent width (moe/latent_projection.py)
        h = config.moe_latent_size or config.hidden_size
        etp = parallel_state.get_expert_tensor_parallel_group().size()
        if config.add_bias_linear and etp > 1:
            raise ValueError(f"expert biases need expert_tensor_parallel_size 1, got {etp}: "
                             "a slice's partial sum would add its bias once per slice")
        fc1 = 2 * ffn_hidden_size if config.gated_linear_unit else ffn_hidden_size   # [gate | up]
        self.linear_fc1 = ExpertLinear(_expert_weight((fc1, h), 0, config.init_method, config,
                                                      stride=2 if config.gated_linear_unit else 1),
                                       _expert_bias(fc1, config))
        self.linear_fc2 = ExpertLinear(_expert_weight((h, ffn_hidden_size), 1,
                                                      config.output_layer_init_method, config),
                                       _expert_bias(h, config))
        self.activation_func = mlp_activation(config)   # with --swiglu: silu(gate) * up

    def forward(self, x):
        align = get_align_size_for_quantization(self.config)
        if not align:
            return self.linear_fc2(self.activation_func(self.linear_fc1(x)))
        rows = x.size(0)   # fp8: padded to whole multiples of ``align`` (see the module docstring)
        hidden = self.activation_func(self.linear_fc1(pad_rows(x, align)))
        return self.linear_fc2(pad_rows(hidden[:rows], align))[:rows]


class SequentialMLP(MegatronModule):
    def __init__(self, num_local_experts: int, config, layer_number: int, local_expert_indices: list[int]):
        super().__init__(config)
        ffn = config.moe_ffn_hidden_size or config.ffn_hidden_size
        experts = []
        for index in local_expert_indices:
            with expert_init_rng(config, layer_number, index):
                experts.append(ExpertMLP(config, ffn))
        self.local_experts = torch.nn.ModuleList(experts)
        self.num_local_experts = num_local_experts

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        """Local expert i's ``local_experts.<i>.linear_fc1.weight`` becomes slice ``first + i``
        of the one ``experts.linear_fc1.weight`` every expert shares (Megatron-Core's key)."""
        out = {}
        for i, expert in enumerate(self.local_experts):
            local = f"{prefix}local_experts.{i}."
            expert_dict = sharded_state_dict_default(
                expert, local, expert_sharded_offsets(sharded_offsets, self.num_local_experts, i), metadata)
            out.update(replace_prefix_for_sharding(expert_dict, local, f"{prefix}experts."))
        return out

    @traced(args=lambda self, permuted_local_hidden_states, tokens_per_expert: {
        "tokens": short_value(permuted_local_hidden_states),
        "tokens_per_expert": tokens_per_expert.tolist()})
    def forward(self, permuted_local_hidden_states, tokens_per_expert):
        """Rows arrive grouped by local expert (tokens_per_expert[i] rows for expert i)."""
        chunks = torch.split(permuted_local_hidden_states, tokens_per_expert.tolist())   # host counts
        outputs = [expert(chunk) for expert, chunk in zip(self.local_experts, chunks)]
        return torch.cat(outputs, dim=0), None
