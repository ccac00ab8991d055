"""minitron's MambaMixer against Megatron-Core 0.19.2's (marked mcore).

Megatron's mixer cannot run as it stands on a CPU: its constructor refuses to build without
mamba_ssm (whose RMSNormGated it subclasses), and both of its forward paths call CUDA/Triton
kernels for the scan (mamba_split_conv1d_scan_combined, mamba_chunk_scan_combined). What does
run is the rest of its non-fused path (``use_mamba_mem_eff_path=False``: _ssm_prefill): in_proj,
the split into z / xBC / dt, the causal conv (its F.conv1d fallback when causal_conv1d is
missing), the rearranges into heads and groups, D, dt_bias, A = -exp(A_log), the gated norm
and out_proj. So this test builds Megatron's own MambaMixer with two stand-ins, written here
and not minitron's code under test:

* the scan kernel: the step-by-step recurrence (``ssd_recurrence``; minitron's mixer runs the
  *chunked* scan, and test_ssm holds the two together), called with the arguments Megatron
  passes the kernel (dt before softplus, dt_bias, z=None because rmsnorm is on);
* RMSNormGated: a few lines of torch computing norm(y * silu(z)) * weight per group.

With those, both mixers must name and shape every parameter alike (the state dict loads one
to one) and give the same output within 1e-5 (fp32). Megatron's tensor-parallel split is held
by its constructor's shapes at tp = 2 and 4, built with a stand-in group that only answers
size() and rank(); the split's numbers are test_ssm's (a tp run equals the serial mixer).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minitron.core.ssm.ssd import ssd_recurrence
from test_mcore_peer import one_rank  # noqa: F401  (the fixture: a world of one, CUDA pointed at the CPU)

pytestmark = pytest.mark.mcore
try:
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.ssm import mamba_mixer as mcore_mamba
    from megatron.core.tensor_parallel import ColumnParallelLinear as McoreColumn
    from megatron.core.tensor_parallel import RowParallelLinear as McoreRow
    from megatron.core.transformer.transformer_config import TransformerConfig as McoreConfig
except ImportError as exc:
    pytest.skip(f"megatron.core's mamba mixer does not import ({exc}); it needs einops too",
                allow_module_level=True)

from minitron.core import parallel_state
from minitron.core.ssm.mamba_mixer import MambaMixer
from minitron.core.transformer import TransformerConfig

HIDDEN, SEQ, BATCH, CHUNK, TOL = 32, 11, 2, 4, 1e-5
MAMBA = dict(mamba_state_dim=8, mamba_head_dim=8, mamba_num_groups=2)
SHAPE = dict(num_layers=1, hidden_size=HIDDEN, num_attention_heads=4, hidden_dropout=0.0, attention_dropout=0.0)
CASES = {"heads from expand (8 heads, 2 groups)": {}, "mamba_num_heads 4, 4 groups": dict(mamba_num_heads=4,
                                                                                           mamba_num_groups=4)}


class _RMSNormGated(torch.nn.Module):
    """mamba_ssm's RMSNormGated with norm_before_gate=False, as Megatron constructs it."""

    def __init__(self, hidden_size, eps=1e-5, group_size=None, norm_before_gate=False, device=None, dtype=None):
        super().__init__()
        self.eps, self.group_size = eps, group_size
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.register_parameter("bias", None)

    def forward(self, x, z=None):
        x = x * F.silu(z)
        shape = x.shape
        x = x.reshape(*shape[:-1], shape[-1] // self.group_size, self.group_size)
        x = x / torch.sqrt((x * x).mean(-1, keepdim=True) + self.eps)
        return x.reshape(shape) * self.weight


def _scan_kernel(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, dt_softplus=False,
                 return_final_states=False, initial_states=None, **_):
    assert z is None and dt_softplus and initial_states is None and not return_final_states
    return ssd_recurrence(x, F.softplus(dt + dt_bias), A, B, C, D)


class _Group:
    """Answers what Megatron's constructors ask a tensor-parallel group, for shapes only."""

    def __init__(self, size):
        self._size = size

    def size(self):
        return self._size

    def rank(self):
        return 0


@pytest.fixture
def megatron_mixer(one_rank, monkeypatch):  # noqa: F811
    monkeypatch.setattr(mcore_mamba, "HAVE_MAMBA_SSM", True)
    monkeypatch.setattr(mcore_mamba, "ExtendedRMSNorm", _RMSNormGated)
    monkeypatch.setattr(mcore_mamba, "mamba_chunk_scan_combined", _scan_kernel)
    monkeypatch.setattr(mcore_mamba, "causal_conv1d_fn", None)

    def build(fields, tp_group=None):
        config = McoreConfig(**SHAPE, **{**MAMBA, **fields}, use_cpu_initialization=True, params_dtype=torch.float32,
                             use_mamba_mem_eff_path=False)
        pgs = ProcessGroupCollection.use_mpu_process_groups()
        if tp_group is not None:
            pgs.tp = tp_group
        submodules = mcore_mamba.MambaMixerSubmodules(in_proj=McoreColumn, out_proj=McoreRow)
        return mcore_mamba.MambaMixer(config, submodules, d_model=HIDDEN, chunk_size=CHUNK, pg_collection=pgs)
    return build


def _ours(fields):
    return MambaMixer(TransformerConfig(**SHAPE, **{**MAMBA, **fields}, init_seed=3), d_model=HIDDEN, chunk_size=CHUNK)


def _shapes(module):
    return {k: tuple(v.shape) for k, v in module.state_dict().items() if not k.endswith("_extra_state")}


@pytest.mark.parametrize("name", list(CASES))
def test_mixer_equals_megatron_cores(megatron_mixer, name):
    ours, theirs = _ours(CASES[name]), megatron_mixer(CASES[name])
    assert _shapes(ours) == _shapes(theirs), f"{name}: {set(_shapes(ours)) ^ set(_shapes(theirs))}"
    with torch.no_grad():   # move every weight off its initial value (D and the norm start at 1)
        for p in ours.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.1)
    theirs.load_state_dict(ours.state_dict(), strict=True)
    hidden = torch.randn(SEQ, BATCH, HIDDEN, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        (mine, my_bias), (megatrons, their_bias) = ours(hidden), theirs.eval()(hidden)
    assert my_bias is None and their_bias is None
    diff = (mine - megatrons).abs().max().item()
    assert diff <= TOL, f"{name}: output differs from Megatron-Core's mixer by {diff:.2e}"


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_shapes_equal_megatron_cores(megatron_mixer, monkeypatch, tp):
    """Each rank's parameter shapes at tp, Megatron's constructor against minitron's (whose
    tensor-parallel size is read from parallel_state, pointed at tp here for the build)."""
    fields = dict(mamba_num_heads=8, mamba_num_groups=4)
    theirs = megatron_mixer(fields, _Group(tp))
    monkeypatch.setattr(parallel_state, "get_tensor_model_parallel_world_size", lambda: tp)
    ours = _ours(fields)
    assert _shapes(ours) == _shapes(theirs)
    assert ours.in_proj.weight.partition_sizes == theirs.in_proj.weight.partition_sizes
    assert ours.conv1d_weight.partition_sizes == theirs.conv1d_weight.partition_sizes


def _checkpoint_keys(sharded: dict) -> set[str]:
    """The torch_dist keys a sharded state dict writes (a factory's as it builds them)."""
    keys = set()
    for sh in sharded.values():
        pieces = sh.build() if hasattr(sh, "build") else [sh]
        keys |= {p.key for p in (pieces if isinstance(pieces, list) else [pieces])}
    return {k for k in keys if not k.endswith("_extra_state")}


def test_checkpoint_keys_equal_megatron_cores(megatron_mixer):
    """torch_dist's keys: in_proj split into z, x, B, C, dt; the conv under conv1d.weight/.bias."""
    from megatron.core import parallel_state as mcore_ps
    fields = CASES["heads from expand (8 heads, 2 groups)"]
    ours, theirs = _ours(fields), megatron_mixer(fields)
    metadata = {"dp_cp_group": mcore_ps.get_data_parallel_group(with_context_parallel=True)}
    mine, megatrons = _checkpoint_keys(ours.sharded_state_dict("mixer.")), \
        _checkpoint_keys(theirs.sharded_state_dict("mixer.", metadata=metadata))
    assert mine == megatrons, f"only minitron's {sorted(mine - megatrons)}; only Megatron's {sorted(megatrons - mine)}"
