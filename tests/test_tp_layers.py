"""The parallel layers against their serial selves: same numbers, same gradients, exact weights."""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from distributed import run_ranks
from minitron.core import parallel_state
from minitron.core.saved_tensors import SavedTensors
from minitron.core.tensor_parallel import (
    ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, model_parallel_cuda_manual_seed)
from minitron.core.transformer import TransformerConfig

H, OUT, VOCAB = 8, 12, 8


def _config(tp: int, sp: bool = False) -> TransformerConfig:
    return TransformerConfig(num_layers=1, hidden_size=H, num_attention_heads=tp,
                             tensor_model_parallel_size=tp, sequence_parallel=sp)


def _master(shape, config) -> torch.Tensor:
    """The full weight a serial layer draws first after seeding: what the slices must add up to."""
    model_parallel_cuda_manual_seed(5)
    return config.init_method(torch.empty(*shape))


def _check_embedding(rank: int) -> bool:
    tp, r = parallel_state.get_tensor_model_parallel_world_size(), parallel_state.get_tensor_model_parallel_rank()
    config = _config(tp)
    model_parallel_cuda_manual_seed(5)
    emb = VocabParallelEmbedding(VOCAB, H, init_method=config.init_method, config=config)
    master = _master((VOCAB, H), config)
    assert torch.equal(emb.weight.detach(), master.chunk(tp)[r])
    assert (emb.vocab_start_index, emb.vocab_end_index) == (r * VOCAB // tp, (r + 1) * VOCAB // tp)

    ids = torch.tensor([[0, 3, 4, 7], [7, 6, 1, 2]])
    local = emb._lookup_local_slice(ids)
    mine = (ids >= emb.vocab_start_index) & (ids < emb.vocab_end_index)
    assert torch.equal(local[~mine], torch.zeros_like(local[~mine]))           # foreign ids: zeros
    assert torch.equal(local[mine], master[ids[mine]])                          # own ids: my rows
    out = emb(ids)
    assert torch.equal(out, F.embedding(ids, master))                           # the sum: every row once
    out.sum().backward()
    counts = torch.bincount(ids.flatten(), minlength=VOCAB).float()
    expected = counts.unsqueeze(1).expand(VOCAB, H)   # each row's grad: how often its id occurs
    assert torch.equal(emb.weight.grad, expected.chunk(tp)[r])
    return True


def test_vocab_parallel_embedding_masks_foreign_ids_and_sums_to_serial():
    assert run_ranks(_check_embedding, world_size=2, tp=2) == [True, True]


def _check_linears(rank: int) -> dict:
    tp, r = parallel_state.get_tensor_model_parallel_world_size(), parallel_state.get_tensor_model_parallel_rank()
    config = _config(tp)
    x = torch.randn(3, 2, H, generator=torch.Generator().manual_seed(1))        # [s, b, h], same everywhere
    gy = torch.randn(3, 2, OUT, generator=torch.Generator().manual_seed(2))
    diffs = {}

    # Column-parallel, with and without gather_output; bias returned unadded on request.
    w = _master((OUT, H), config)
    b = torch.linspace(-1, 1, OUT)
    for gather in (True, False):
        model_parallel_cuda_manual_seed(5)
        col = ColumnParallelLinear(H, OUT, config=config, init_method=config.init_method, gather_output=gather)
        assert torch.equal(col.weight.detach(), w.chunk(tp)[r])
        with torch.no_grad():
            col.bias.copy_(b.chunk(tp)[r])
        xi = x.clone().requires_grad_()
        y, bias = col(xi)
        assert bias is None
        serial = F.linear(x, w, b)
        diffs[f"column gather={gather}"] = (y - (serial if gather else serial.chunk(tp, -1)[r])).abs().max().item()
        # The gradient of a replicated output, or of my slice of it: each rank's input grad must
        # come out whole (copy_to's all-reduce in backward), the weight grad as my slice.
        y.backward(gy if gather else gy.chunk(tp, -1)[r])
        wx = w.clone().requires_grad_()
        xs = x.clone().requires_grad_()
        F.linear(xs, wx, b).backward(gy)
        diffs[f"column gather={gather} dx"] = (xi.grad - xs.grad).abs().max().item()
        diffs[f"column gather={gather} dw"] = (col.weight.grad - wx.grad.chunk(tp)[r]).abs().max().item()

    model_parallel_cuda_manual_seed(5)
    col = ColumnParallelLinear(H, OUT, config=config, init_method=config.init_method, skip_bias_add=True)
    out, bias = col(x)
    assert bias is col.bias and out.shape == (3, 2, OUT // tp)

    # Row-parallel, from a whole input (it scatters) and from my slice (input_is_parallel).
    w = _master((H, OUT), config)
    xw = torch.randn(3, 2, OUT, generator=torch.Generator().manual_seed(3))
    for parallel in (False, True):
        model_parallel_cuda_manual_seed(5)
        row = RowParallelLinear(OUT, H, config=config, init_method=config.init_method, input_is_parallel=parallel)
        assert torch.equal(row.weight.detach(), w.chunk(tp, dim=1)[r])
        xi = (xw.chunk(tp, -1)[r] if parallel else xw).clone().requires_grad_()
        y, bias = row(xi)
        assert bias is None
        diffs[f"row parallel_input={parallel}"] = (y - F.linear(xw, w)).abs().max().item()
        y.backward(gy[..., :H])
        xs = xw.clone().requires_grad_()
        F.linear(xs, w).backward(gy[..., :H])
        want = xs.grad.chunk(tp, -1)[r] if parallel else xs.grad
        diffs[f"row parallel_input={parallel} dx"] = (xi.grad - want).abs().max().item()
    return diffs


def test_column_and_row_parallel_linear_equal_serial_linear():
    for diffs in run_ranks(_check_linears, world_size=2, tp=2):
        assert max(diffs.values()) < 1e-6, diffs


def _check_bad_inputs(rank: int) -> list[str]:
    messages = []
    for make in (lambda: RowParallelLinear(8, 8, config=_config(2, sp=True), init_method=lambda w: w),
                 lambda: ColumnParallelLinear(8, 7, config=_config(2), init_method=lambda w: w),
                 lambda: TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=3,
                                           kv_channels=2, tensor_model_parallel_size=2)):
        try:
            make()
            messages.append("no error")
        except ValueError as err:
            messages.append(str(err))
    return messages


def test_bad_shapes_get_one_clear_line():
    row_sp, col_out, heads = run_ranks(_check_bad_inputs, world_size=2, tp=2)[0]
    assert "input_is_parallel=True" in row_sp
    assert "output size: 7 is not divisible by 2" in col_out
    assert "num_attention_heads 3 is not divisible by tensor_model_parallel_size 2" in heads


def _check_sequence_parallel_column(rank: int) -> dict:
    """A column linear under sequence parallelism: serial numbers, and only my rows kept."""
    tp, r = parallel_state.get_tensor_model_parallel_world_size(), parallel_state.get_tensor_model_parallel_rank()
    config = _config(tp, sp=True)
    model_parallel_cuda_manual_seed(5)
    col = ColumnParallelLinear(H, OUT, config=config, init_method=config.init_method)
    x = torch.randn(4, 2, H, generator=torch.Generator().manual_seed(1))         # the whole [s, b, h]
    gy = torch.randn(4, 2, OUT, generator=torch.Generator().manual_seed(2))
    mine = x.chunk(tp)[r].clone().requires_grad_()                              # my s/t rows
    with SavedTensors(exclude=col.parameters()) as saved:
        y, _ = col(mine)
    y.backward(gy.chunk(tp, -1)[r])
    w = col.weight.detach().clone()
    ws, xs = w.new_zeros(OUT, H), x.clone().requires_grad_()
    ws[r * OUT // tp:(r + 1) * OUT // tp] = w                                    # a serial linear on my
    F.linear(xs, ws).backward(torch.cat([torch.zeros_like(g) if i != r else g    # output columns only:
                                         for i, g in enumerate(gy.chunk(tp, -1))], -1))   # dx sums over ranks
    buffers = parallel_state.get_global_memory_buffer().buffer
    return {"saved": saved.shapes, "y": (y - F.linear(x, w)).abs().max().item(),
            "dw": (col.weight.grad - gy.chunk(tp, -1)[r].reshape(-1, OUT // tp).t() @ x.reshape(-1, H)).abs().max().item(),
            "my dx share": xs.grad, "dx": mine.grad, "buffers": [list(b.shape) for b in buffers.values()]}


def test_sequence_parallel_column_keeps_only_its_rows_and_gathers_them_again_in_backward(tmp_path):
    results = run_ranks(_check_sequence_parallel_column, world_size=2, tp=2, trace_dir=str(tmp_path))
    summed_dx = sum(res["my dx share"] for res in results)                      # the serial dx
    for r, res in enumerate(results):
        assert res["saved"] == [[2, 2, H]], res["saved"]     # my 2 of 4 rows, not the gathered 4
        assert res["y"] < 1e-6 and res["dw"] < 1e-6
        assert (res["dx"] - summed_dx.chunk(2)[r]).abs().max() < 1e-6            # reduce-scattered
        assert res["buffers"] == [[4 * 2 * H]]               # one "mpu" buffer, forward and backward
        records = [json.loads(line) for line in (tmp_path / f"rank{r}.jsonl").read_text().splitlines()]
        by_id = {rec["id"]: rec for rec in records}
        gathers = [by_id[rec["parent"]]["name"].split(".")[-1] for rec in records
                   if rec["name"] == "torch.distributed.all_gather_into_tensor"]
        # once in forward, once more in backward (async, overlapping the input-gradient product)
        assert gathers == ["linear_with_grad_accumulation_and_async_allreduce", "backward"]


def test_global_memory_buffer_lends_one_growing_allocation_per_name():
    from minitron.core.utils import GlobalMemoryBuffer
    buf = GlobalMemoryBuffer()
    a = buf.get_tensor([2, 3], torch.float32, "mpu")
    b = buf.get_tensor([6], torch.float32, "mpu")
    assert a.data_ptr() == b.data_ptr()                      # same name, same memory
    assert buf.get_tensor([2], torch.float32, "other").data_ptr() != a.data_ptr()
    big = buf.get_tensor([4, 4], torch.float32, "mpu")       # grows: a fresh, larger allocation
    assert big.shape == (4, 4) and buf.buffer[("mpu", torch.float32, torch.device("cpu"))].numel() == 16
    assert buf.get_tensor([3], torch.float16, "mpu").dtype == torch.float16   # one per dtype
