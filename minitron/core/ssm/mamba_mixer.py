"""MambaMixer: a Mamba-2 layer's sequence mixing, as Megatron-Core 0.19.2 builds it.

    hidden [s, b, h] ─ in_proj (column-parallel) ─> z | x B C | dt
        x B C ─ causal depthwise conv1d (width d_conv) ─ SiLU ─> x, B, C
        dt ─ softplus(dt + dt_bias) ;  A = -exp(A_log)
        y = SSD scan (ssd.py) over x with dt, A, B, C, plus D * x
        y ─ gated RMSNorm: norm(y * silu(z)), per group ─ out_proj (row-parallel) ─> [s, b, h]

Where the parts sit matters for tensor parallelism. One in_proj makes five outputs of different
widths (z and x: d_inner each; B and C: ngroups * d_state each; dt: nheads), and each of the five
is cut by heads and groups: rank r of p keeps heads [r*H/p, (r+1)*H/p) and groups
[r*G/p, (r+1)*G/p). So rank r's in_proj rows are [z_r | x_r | B_r | C_r | dt_r], not a
contiguous slice of the whole matrix; the full weight is drawn once and each section cut
(``_tp_sections``), which also keeps every layout's weights the serial model's. Everything
after in_proj is per head or per group, so nothing is exchanged until out_proj's reduction:
the conv works per channel, A_log / D / dt_bias per head, and the norm normalizes within a
group (never across groups, which would need the other ranks' channels).

With sequence parallelism in_proj all-gathers the sequence and out_proj reduce-scatters it,
as the attention's linears do: the scan needs the whole sequence of its heads.

Parameter names and shapes are Megatron's (conv1d_weight / conv1d_bias are plain parameters
there since 0.19); so are the torch_dist checkpoint's keys (mamba_checkpoint.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from minitron.core import parallel_state
from minitron.core.ssm.mamba_checkpoint import mixer_sharded_state_dict
from minitron.core.ssm.ssd import ssd_chunked
from minitron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from minitron.core.tensor_parallel.weight_init import init_device, set_tensor_model_parallel_attributes
from minitron.core.transformer.module import MegatronModule
from minitron.trace import traced


def _tp_sections(full: torch.Tensor, sizes: list[int], rank: int, world: int) -> torch.Tensor:
    """This rank's part of a tensor made of sections along dim 0: its share of each, stacked."""
    return torch.cat([section.chunk(world, dim=0)[rank] for section in full.split(sizes, dim=0)])


class GatedRMSNorm(torch.nn.Module):
    """norm(y * silu(z)) * weight, normalized over groups of ``group_size`` channels (Mamba-2's
    RMSNormGated with norm_before_gate=False). In fp32, as the fused kernel computes it."""

    def __init__(self, hidden_size: int, group_size: int, eps: float = 1e-5, dtype=None):
        super().__init__()
        self.group_size, self.eps = group_size, eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=dtype, device=init_device()))

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        gated = y.float() * F.silu(z.float())
        grouped = gated.unflatten(-1, (-1, self.group_size))
        normed = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed.flatten(-2) * self.weight.float()).to(y.dtype)


class MambaMixer(MegatronModule):
    def __init__(self, config, d_model: int, d_conv: int = 4, conv_init: float | None = None,
                 expand: int = 2, A_init_range=(1, 16), D_has_hdim: bool = False, rmsnorm: bool = True,
                 norm_before_gate: bool = False, dt_min: float = 0.001, dt_max: float = 0.1,
                 dt_init: str = "random", dt_scale: float = 1.0, dt_init_floor: float = 1e-4,
                 bias: bool = False, conv_bias: bool = True, chunk_size: int = 128, layer_number=None):
        super().__init__(config)
        if bias or not conv_bias or norm_before_gate or not rmsnorm or D_has_hdim:
            # Megatron's mixer asserts the first three; the last two are mamba_ssm options
            # its training path does not take either.
            raise ValueError("MambaMixer is built as Megatron's: no linear bias, a conv bias, the gated "
                             "norm after the gate, D per head")
        self.d_model, self.d_conv, self.chunk_size, self.layer_number = d_model, d_conv, chunk_size, layer_number
        self.d_state, self.headdim, self.ngroups = config.mamba_state_dim, config.mamba_head_dim, config.mamba_num_groups
        if config.mamba_num_heads is not None:
            self.nheads = config.mamba_num_heads
            self.d_inner = self.nheads * self.headdim
        else:
            self.d_inner = expand * d_model
            if self.d_inner % self.headdim:
                raise ValueError(f"d_inner {self.d_inner} is not divisible by mamba_head_dim {self.headdim}")
            self.nheads = self.d_inner // self.headdim
        tp = parallel_state.get_tensor_model_parallel_world_size()
        rank = parallel_state.get_tensor_model_parallel_rank()
        for what, n in (("mamba heads", self.nheads), ("mamba groups", self.ngroups)):
            if n % tp:
                raise ValueError(f"{n} {what} do not split over tensor_model_parallel_size {tp}")
        if self.nheads % self.ngroups:
            raise ValueError(f"{self.nheads} mamba heads do not split into {self.ngroups} groups")
        self.nheads_local_tp, self.ngroups_local_tp = self.nheads // tp, self.ngroups // tp
        self.d_inner_local_tp = self.d_inner // tp
        gs = self.ngroups * self.d_state

        # z x B C dt, each section cut by heads / groups (module docstring)
        sections = [self.d_inner, self.d_inner, gs, gs, self.nheads]
        self.in_proj = ColumnParallelLinear(d_model, sum(sections), config=config, init_method=torch.nn.init.zeros_,
                                            bias=False, gather_output=False)
        self.in_proj.weight.partition_sizes = [s // tp for s in sections]   # Megatron's resharding hint
        conv_sections = [self.d_inner, gs, gs]                              # x B C
        conv_dim = sum(conv_sections) // tp
        dev, dtype = init_device(), config.params_dtype
        self.conv1d_weight = torch.nn.Parameter(torch.empty(conv_dim, 1, d_conv, device=dev, dtype=dtype))
        self.conv1d_bias = torch.nn.Parameter(torch.empty(conv_dim, device=dev, dtype=dtype))
        self.dt_bias = torch.nn.Parameter(torch.empty(self.nheads_local_tp, device=dev, dtype=dtype))
        self.A_log = torch.nn.Parameter(torch.empty(self.nheads_local_tp, device=dev, dtype=torch.float32))
        self.D = torch.nn.Parameter(torch.ones(self.nheads_local_tp, device=dev))   # fp32, as Megatron keeps it
        self.norm = GatedRMSNorm(self.d_inner_local_tp, self.d_inner_local_tp // self.ngroups_local_tp,
                                 eps=1e-5, dtype=dtype)
        for p in (self.conv1d_weight, self.conv1d_bias, self.dt_bias, self.A_log, self.D, self.norm.weight):
            set_tensor_model_parallel_attributes(p, True, 0)
        for p in (self.conv1d_weight, self.conv1d_bias):
            p.partition_sizes = [s // tp for s in conv_sections]
        self.out_proj = RowParallelLinear(self.d_inner, d_model, config=config, bias=False,
                                          init_method=config.output_layer_init_method,
                                          input_is_parallel=True, skip_bias_add=True)
        if config.perform_initialization:
            self._init_weights(sections, conv_sections, A_init_range, dt_min, dt_max, dt_init_floor,
                               conv_init, rank, tp)

    @torch.no_grad()
    def _init_weights(self, sections, conv_sections, A_init_range, dt_min, dt_max, dt_floor, conv_init, rank, tp):
        """Megatron's initial values, each drawn whole and cut (so any tp starts from the serial
        model's numbers): in_proj from init_method; the conv as torch's Conv1d would (Kaiming
        uniform, bound 1/sqrt(d_conv) for the bias); dt_bias so that softplus(dt_bias) is
        log-uniform in [dt_min, dt_max]; A uniform in A_init_range, kept as its log."""
        def cut(full, sizes):
            return _tp_sections(full, sizes, rank, tp)
        w = torch.empty(sum(sections), self.d_model)  # host: drawn whole on the CPU, as weight_init.py, then cut
        self.config.init_method(w)
        self.in_proj.weight.copy_(cut(w, sections))
        conv_w = torch.empty(sum(conv_sections), 1, self.d_conv)  # host: as w
        conv_b = torch.empty(sum(conv_sections))  # host: as w
        torch.nn.init.kaiming_uniform_(conv_w, a=math.sqrt(5))
        torch.nn.init.uniform_(conv_b, -1 / math.sqrt(self.d_conv), 1 / math.sqrt(self.d_conv))
        if conv_init is not None:
            torch.nn.init.uniform_(conv_w, -conv_init, conv_init)
        else:
            torch.nn.init.kaiming_uniform_(conv_w, a=math.sqrt(5))
        self.conv1d_weight.copy_(cut(conv_w, conv_sections))
        self.conv1d_bias.copy_(cut(conv_b, conv_sections))
        dt = torch.exp(torch.rand(self.nheads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))  # host: as w
        dt = dt.clamp(min=dt_floor)
        self.dt_bias.copy_(cut(dt + torch.log(-torch.expm1(-dt)), [self.nheads]))   # softplus^-1(dt)
        A = torch.empty(self.nheads).uniform_(*A_init_range)  # host: as w
        self.A_log.copy_(cut(torch.log(A), [self.nheads]))

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        """Megatron's checkpoint keys, each fused weight saved so any tp reads it (mamba_checkpoint.py)."""
        return mixer_sharded_state_dict(self, prefix, sharded_offsets, metadata)

    @traced
    def forward(self, hidden_states: torch.Tensor):
        """[s, b, h] (this rank's part of s with sequence parallelism) -> (out [s, b, h], None)."""
        zxBCdt, _ = self.in_proj(hidden_states)                   # [s, b, sections/tp], all of s
        zxBCdt = zxBCdt.transpose(0, 1)                           # [b, s, .]: the scan runs along s
        length = zxBCdt.shape[1]
        d, g = self.d_inner_local_tp, self.ngroups_local_tp * self.d_state
        z, xBC, dt = zxBCdt.split([d, d + 2 * g, self.nheads_local_tp], dim=-1)
        # Causal: pad d_conv - 1 steps on the left only (conv1d pads both ends; the right-hand
        # outputs, which would see the future, are cut off). groups = channels: depthwise.
        xBC = F.conv1d(xBC.transpose(1, 2), self.conv1d_weight, self.conv1d_bias,
                       padding=self.d_conv - 1, groups=xBC.shape[-1])[..., :length]
        xBC = F.silu(xBC).transpose(1, 2)
        x, B, C = xBC.split([d, g, g], dim=-1)
        y = ssd_chunked(x.unflatten(-1, (-1, self.headdim)).float(),
                        F.softplus(dt.float() + self.dt_bias.float()),
                        -torch.exp(self.A_log.float()),
                        B.unflatten(-1, (-1, self.d_state)).float(), C.unflatten(-1, (-1, self.d_state)).float(),
                        self.chunk_size, D=self.D.float())
        y = y.flatten(-2).to(hidden_states.dtype).transpose(0, 1)  # [s, b, d_inner/tp]
        y = self.norm(y, z.transpose(0, 1))
        return self.out_proj(y)
