"""minitron's chunked SSD scan against the Mamba-2 authors' own minimal PyTorch reference,
``ssd_minimal_discrete`` in mamba_ssm/modules/ssd_minimal.py of the state-spaces/mamba project.

The reference is read at test time, never copied: .ci/run downloads mamba-ssm's source archive
from PyPI (its CUDA build skipped), unpacks that one file and names it in
MINITRON_SSD_MINIMAL; elsewhere the test is skipped, saying so. The file imports the fused
Triton kernel only to compare against it in its own self-test, so that import is satisfied by an
empty stand-in module here; the function under comparison is plain torch and einops.

The reference takes the discretised inputs, X = x dt and A = A dt, one B and C per head, and a
length in whole chunks; minitron takes dt, A per head, B and C per group. Both run in float64:
the two are the same sums in another order, so they agree to rounding (1e-10 relative).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types

import pytest
import torch

from minitron.core.ssm.ssd import ssd_chunked

SOURCE = os.environ.get("MINITRON_SSD_MINIMAL")
pytestmark = [pytest.mark.ssd_reference,
              pytest.mark.skipif(not SOURCE, reason="MINITRON_SSD_MINIMAL names no ssd_minimal.py (.ci/run "
                                                    "fetches it from mamba-ssm's source archive)")]


@pytest.fixture(scope="module")
def reference():
    pytest.importorskip("einops", reason="the reference is written with einops")
    stand_ins = {name: types.ModuleType(name) for name in
                 ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton", "mamba_ssm.ops.triton.ssd_combined")}
    stand_ins["mamba_ssm.ops.triton.ssd_combined"].mamba_chunk_scan_combined = None   # its self-test's kernel
    saved = {name: sys.modules.get(name) for name in stand_ins}
    sys.modules.update(stand_ins)
    try:
        spec = importlib.util.spec_from_file_location("ssd_minimal_reference", SOURCE)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    return module.ssd_minimal_discrete


@pytest.mark.parametrize("groups, chunk, with_state", [(1, 8, False), (2, 4, True), (4, 16, True)])
def test_the_chunked_scan_is_the_authors_minimal_ssd(reference, groups, chunk, with_state):
    gen = torch.Generator().manual_seed(7 + groups)
    batch, length, heads, headdim, state = 2, 32, 4, 3, 5
    x = torch.randn(batch, length, heads, headdim, generator=gen, dtype=torch.float64)
    dt = torch.nn.functional.softplus(torch.randn(batch, length, heads, generator=gen, dtype=torch.float64))
    A = -torch.rand(heads, generator=gen, dtype=torch.float64) * 2
    B = torch.randn(batch, length, groups, state, generator=gen, dtype=torch.float64)
    C = torch.randn(batch, length, groups, state, generator=gen, dtype=torch.float64)
    start = torch.randn(batch, heads, headdim, state, generator=gen, dtype=torch.float64) if with_state else None

    ours, ours_last = ssd_chunked(x, dt, A, B, C, chunk, initial_state=start, return_final_state=True)
    per_head = heads // groups
    theirs, theirs_last = reference(x * dt[..., None], A * dt, B.repeat_interleave(per_head, dim=2),
                                    C.repeat_interleave(per_head, dim=2), chunk,
                                    initial_states=None if start is None else start[:, None])
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ours_last, theirs_last, rtol=1e-10, atol=1e-10)
