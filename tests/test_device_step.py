"""Where a training step's tensors are made: on the rank's device, not on the host (issue 42).

A CPU-only torch cannot make CUDA tensors, but FakeTensorMode can: tensors that carry a device,
a shape and a dtype and no data. Mixing a fake "cuda:0" tensor with a CPU one raises
"Expected all tensors to be on the same device", as a real GPU would, and asking a fake tensor
for a value (``.item()``, ``int()``) raises too, as a host sync would cost a real GPU its queue.
So a stand-in accelerator that answers "cuda:0" and a fake mode around the step show, on the
CPU, every place a step still makes its tensors on the host.

1. GPT built on the fake GPU, with and without --use-cpu-initialization: every parameter and
   buffer is on cuda:0, and the no-pipelining schedule's forward (loss included) runs there.
   (Before issue 42 the weights were made on the CPU and the embedding lookup refused the
   cuda:0 batch: "Expected all tensors to be on the same device ... cuda:0 and cpu".)
2. The pipeline's receive buffers are made on the device.
3. The loss scale lives on the device, and the scaler's update reads no value back.
4. Without the flag, a GPU rank draws each tensor-parallel slice on its own stream (Megatron's
   _initialize_affine_weight_gpu); a CPU rank always draws the full weight (test on real ranks).
5. MoE reads its per-expert counts without one host sync per expert.

Backward through fake CUDA tensors does not run on a CPU torch: only forwards are shown here.
"""

from __future__ import annotations

import contextlib
from functools import partial

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from distributed import run_ranks
from minitron.accelerator import get_accelerator, set_accelerator
from minitron.accelerator.cpu_accelerator import CPU_Accelerator
from minitron.core import parallel_state
from minitron.core.models.gpt import GPTModel
from minitron.core.optimizer import DynamicGradScaler
from minitron.core.pipeline_parallel import p2p_communication as p2p
from minitron.core.pipeline_parallel.schedules import forward_backward_no_pipelining
from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
from minitron.core.tensor_parallel.weight_init import initialize_affine_weight
from minitron.core.transformer import TransformerConfig
from minitron.pretrain_gpt import loss_func

SIZES = dict(num_layers=2, hidden_size=16, num_attention_heads=4, hidden_dropout=0.0, attention_dropout=0.0)
VOCAB, SEQ, BATCH = 32, 8, 2


class _CudaStandIn(CPU_Accelerator):
    """Says the rank computes on cuda:0. device_count stays 0, so the RNG tracker keeps to the
    CPU generator (it swaps CUDA generator states only when there is a GPU to ask)."""

    def current_device_name(self) -> str:
        return "cuda:0"


class _AroundDeviceGuards(TorchFunctionMode):
    """A CPU-only torch's Python bindings of ``contiguous()`` and ``copy_()`` open a CUDA device
    guard for a cuda tensor and abort ("not linked with support for cuda devices") before any
    kernel runs. The aten ops underneath (a clone into contiguous memory; the copy) reach the
    fake kernels, which do check the devices."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.contiguous and not args[0].is_contiguous():
            return torch.ops.aten.clone.default(args[0], memory_format=torch.contiguous_format)
        if func is torch.Tensor.copy_:
            return torch.ops.aten.copy_.default(*args, **kwargs)
        return func(*args, **kwargs)


@contextlib.contextmanager
def fake_gpu():
    """Within the block this rank computes on a fake cuda:0 (autograd off: it cannot record
    fake CUDA tensors on a CPU-only torch)."""
    before = get_accelerator()
    set_accelerator(_CudaStandIn())
    try:
        with FakeTensorMode(allow_non_fake_inputs=True), _AroundDeviceGuards(), torch.no_grad():
            yield
    finally:
        set_accelerator(before)


def _forward_on_fake_gpu(use_cpu_initialization: bool, rank: int) -> dict:
    torch.set_num_threads(1)
    config = TransformerConfig(**SIZES, use_cpu_initialization=use_cpu_initialization)
    model_parallel_cuda_manual_seed(1)
    with fake_gpu():
        model = GPTModel(config, VOCAB, SEQ, share_embeddings_and_output_weights=True)
        placed = {name: str(t.device) for name, t in [*model.named_parameters(), *model.named_buffers()]}
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), device="cuda:0")
        batch = {"tokens": ids, "labels": ids, "loss_mask": torch.ones(BATCH, SEQ, device="cuda:0"),
                 "position_ids": torch.arange(SEQ, device="cuda:0").expand(BATCH, SEQ)}

        def forward_step(data_iterator, model):   # pretrain_gpt's, with the batch already placed
            b = next(data_iterator)
            output = model(b["tokens"], b["position_ids"], None, labels=b["labels"])
            return output, partial(loss_func, b["loss_mask"])

        losses = forward_backward_no_pipelining(
            forward_step_func=forward_step, data_iterator=iter([batch]), model=[model], num_microbatches=1,
            seq_length=SEQ, micro_batch_size=BATCH, forward_only=True)
        return {"placed": placed, "loss": str(losses[0]["lm loss"].device)}


@pytest.mark.parametrize("use_cpu_initialization", [False, True])
def test_gpt_step_forward_runs_on_the_device(use_cpu_initialization):
    result = run_ranks(partial(_forward_on_fake_gpu, use_cpu_initialization), world_size=1)[0]
    elsewhere = {name: device for name, device in result["placed"].items() if device != "cuda:0"}
    assert not elsewhere, f"made off the device: {elsewhere}"
    assert result["loss"] == "cuda:0"


def _receive_buffers(rank: int) -> list[str]:
    posted = []
    real = torch.distributed.batch_isend_irecv
    torch.distributed.batch_isend_irecv = lambda ops: posted.extend(ops) or []   # the buffers, not the wire
    try:
        with fake_gpu():
            config = TransformerConfig(**SIZES)
            recv_prev, recv_next = p2p._communicate(tensor_send_next=None, tensor_send_prev=None, recv_prev=True,
                                                    recv_next=True, tensor_shape=(SEQ, BATCH, 16), config=config)
            return [str(recv_prev.device), str(recv_next.device), str(len(posted))]
    finally:
        torch.distributed.batch_isend_irecv = real


def test_pipeline_receives_into_device_buffers():
    assert run_ranks(_receive_buffers, world_size=1)[0] == ["cuda:0", "cuda:0", "2"]


def test_loss_scale_lives_on_the_device_and_updates_without_a_sync():
    with fake_gpu():
        scaler = DynamicGradScaler(initial_scale=8.0, min_scale=1.0, growth_factor=2.0, backoff_factor=0.5,
                                   growth_interval=1, hysteresis=1)
        scaler.update(found_inf=True)     # backs off: max(scale * 0.5, min_scale), on the device
        scaler.update(found_inf=False)    # grows: scale * 2
        loss = torch.ones(1, device="cuda:0") * scaler.scale   # what scale_loss multiplies
        # A fake tensor has no value: any .item() above would have raised.
        assert (scaler.scale.device.type, scaler.inv_scale.device.type, loss.device.type) == ("cuda",) * 3


def _slices(use_cpu_initialization: bool, on_gpu_path: bool, rank: int) -> dict:
    """This tp rank's slice of an [8, 4] weight split by rows, and whether the default generator
    was left where it was."""
    config = TransformerConfig(**SIZES, use_cpu_initialization=use_cpu_initialization)
    model_parallel_cuda_manual_seed(3)
    default_before = torch.get_rng_state()
    rows = 8 // parallel_state.get_tensor_model_parallel_world_size()
    weight = torch.empty(rows, 4)
    if on_gpu_path:   # a GPU rank's rule, shown on CPU memory: call the GPU path by name
        from minitron.core.tensor_parallel.weight_init import _initialize_affine_weight_gpu
        _initialize_affine_weight_gpu(weight, torch.nn.init.normal_, partition_dim=0)
    else:
        initialize_affine_weight(weight, config, 8, 4, rows, 0, torch.nn.init.normal_)
    return {"slice": weight, "default_untouched": torch.equal(default_before, torch.get_rng_state()),
            "partition_dim": weight.partition_dim}


def test_slices_drawn_on_the_device_follow_the_model_parallel_stream():
    full = run_ranks(partial(_slices, False, False), world_size=1)[0]["slice"]
    cpu_rule = run_ranks(partial(_slices, False, False), world_size=2, tp=2)   # a CPU rank, flag or not
    gpu_rule = run_ranks(partial(_slices, False, True), world_size=2, tp=2)
    # A CPU rank keeps its slice of the full draw: tp 2's slices make tp 1's weight.
    assert torch.equal(torch.cat([cpu_rule[0]["slice"], cpu_rule[1]["slice"]]), full)
    # The device rule: each rank's own stream (seed + 2718 + tp rank), default stream untouched.
    assert not torch.equal(gpu_rule[0]["slice"], gpu_rule[1]["slice"])
    assert not torch.equal(gpu_rule[0]["slice"], full[:4])
    assert all(r["default_untouched"] and r["partition_dim"] == 0 for r in gpu_rule)


class _CountHostReads(TorchDispatchMode):
    """Counts the reads of one tensor element into Python (``int(t)``, ``.item()``): on a GPU
    each waits for the device to finish everything queued before it."""

    def __init__(self):
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads += 1
        return func(*args, **(kwargs or {}))


def _moe_host_reads(dispatcher: str, grouped: bool, rank: int) -> int:
    from minitron.core.transformer.moe.moe_layer import MoELayer
    torch.set_num_threads(1)
    config = TransformerConfig(**SIZES, num_moe_experts=4, moe_router_topk=2, moe_token_dispatcher_type=dispatcher,
                               moe_grouped_gemm=grouped, add_bias_linear=False)
    model_parallel_cuda_manual_seed(1)
    layer = MoELayer(config).eval()
    hidden = torch.randn(SEQ, BATCH, 16, generator=torch.Generator().manual_seed(0))
    with _CountHostReads() as counter, torch.no_grad():
        layer(hidden)
    return counter.reads


@pytest.mark.parametrize("dispatcher,grouped", [("allgather", False), ("alltoall", False), ("alltoall", True)])
def test_moe_reads_its_expert_counts_without_a_sync_per_expert(dispatcher, grouped):
    # The counts reach the host in one copy (a tensor.cpu() / .tolist(), not counted here: on a
    # GPU that is the one sync per layer Megatron has too); none is read element by element.
    assert run_ranks(partial(_moe_host_reads, dispatcher, grouped), world_size=1)[0] == 0
