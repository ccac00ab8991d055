"""Issue 42, DeepSpeed's side: on a GPU rank the engines (runtime/engine.py, runtime/pipe/) and
ZeRO 0-3 (runtime/zero/) keep every tensor on the rank's device, as DeepSpeed does, not on the CPU.

No test here needs a GPU. A stand-in accelerator says this rank computes on torch's "meta" device:
a device that is not the CPU, whose tensors have shapes and no data, on which a CPU-only torch runs
forward and backward (autograd included), and which refuses to be mixed with CPU tensors ("Tensor
on device cpu is not on the expected device meta!"), as cuda:N refuses. (Fake "cuda:0" tensors,
from torch's FakeTensorMode, were the first choice; on a CPU-only torch 2.13 they fail at copy_
and at slicing, which want a CUDA device guard, and autograd over them aborts the process.)

What a meta tensor cannot do is hold a value, so two things are stood in for:

* collectives: a recording stand-in for minitron.comm's backend takes each one, notes the devices
  of its tensors, and does what it does in a world of one rank (an all-gather or a reduce-scatter
  copies its input; the others leave their tensor as it is);
* the step's one host read, whether any rank overflowed: the test shows it raises on meta (so the
  flag was made on the device), then answers "no overflow" so that the rest of the step runs.
"""

from types import SimpleNamespace

import pytest
import torch

from distributed import run_ranks
from toy_models import toy_mlp

from minitron.accelerator.cpu_accelerator import CPU_Accelerator

DEVICE = "meta"
IN, OUT = 6, 3
# One rank, two micro-batches of 2: a step accumulates one backward, reduces at the second.
CONFIG = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
          "optimizer": {"type": "Adam", "params": {"lr": 0.01}}}


class _DeviceStandIn(CPU_Accelerator):
    """A GPU rank's accelerator, as far as placement goes: this rank computes on DEVICE."""

    def current_device_name(self) -> str:
        return DEVICE


class _Done:
    def wait(self) -> None:
        pass


class _RecordingBackend:
    """minitron.comm's cdb for a world of one rank: group queries go to the real backend; each
    collective records ``(name, devices of its tensors)`` and does its one-rank arithmetic."""

    def __init__(self, real):
        self.real, self.calls = real, []

    def __getattr__(self, name):   # get_rank, get_world_size, new_group...: the real ones
        return getattr(self.real, name)

    def _record(self, name, async_op, *tensors):
        self.calls.append((name, [str(t.device) for t in tensors]))
        return _Done() if async_op else None

    def broadcast(self, tensor, src, group=None, async_op=False):
        return self._record("broadcast", async_op, tensor)

    def all_reduce(self, tensor, op=None, group=None, async_op=False):
        return self._record("all_reduce", async_op, tensor)

    def reduce(self, tensor, dst, op=None, group=None, async_op=False):
        return self._record("reduce", async_op, tensor)

    def all_gather_into_tensor(self, output_tensor, input_tensor, group=None, async_op=False):
        output_tensor.copy_(input_tensor)
        return self._record("all_gather_into_tensor", async_op, output_tensor, input_tensor)

    def reduce_scatter_tensor(self, output_tensor, input_tensor, op=None, group=None, async_op=False):
        output_tensor.copy_(input_tensor)
        return self._record("reduce_scatter_tensor", async_op, output_tensor, input_tensor)

    def send(self, tensor, dst, group=None, tag=0):
        return self._record("send", False, tensor)

    def recv(self, tensor, src=None, group=None, tag=0):
        return self._record("recv", False, tensor)


def _on_device(body):
    """``body(backend)`` in this rank, with the stand-in accelerator and the recording backend
    installed, both restored after. Returns what body returns."""
    from minitron import comm
    from minitron.accelerator import get_accelerator, set_accelerator

    comm.init_distributed()   # wraps the harness's gloo world
    accelerator, real = get_accelerator(), comm.comm.cdb
    backend = _RecordingBackend(real)
    set_accelerator(_DeviceStandIn())
    comm.comm.cdb = backend
    try:
        return body(backend)
    finally:
        comm.comm.cdb = real
        set_accelerator(accelerator)


def _devices(named: dict) -> dict:
    """name -> device, for every tensor given (lists and dicts of tensors flattened by index)."""
    out = {}
    for name, value in named.items():
        if torch.is_tensor(value):
            out[name] = str(value.device)
        elif isinstance(value, dict):
            out.update(_devices({f"{name}[{k}]": v for k, v in value.items()}))
        elif isinstance(value, (list, tuple)):
            out.update(_devices({f"{name}[{k}]": v for k, v in enumerate(value)}))
    return out


def _read_overflow_on_device(optimizer) -> None:
    """The overflow verdict is the step's one host read: on meta it must raise, which shows the
    flag was made on the device (a CPU flag would read fine). Then stand in for it: no overflow."""
    partitions = list(optimizer.averaged_gradients.values())
    with pytest.raises(RuntimeError, match="meta"):
        optimizer.has_overflow(partitions)
    optimizer.has_overflow = lambda partitions: False


def _zero_body(stage: int):
    def body(rank):
        from minitron.runtime import initialize
        model = toy_mlp(0, IN, OUT)   # real weights on the CPU, as a script builds them

        def run(backend):
            config = {**CONFIG, "zero_optimization": {"stage": stage, "reduce_bucket_size": 40}}
            engine, *_ = initialize(model=model, config=config)
            opt = engine.optimizer
            flats = opt.fp16_partitioned_groups_flat if stage == 3 else opt.bit16_groups_flat
            placed = _devices({"param": list(model.parameters()), "flat": flats, "norm_mask": opt.norm_mask,
                               "master": opt.single_partition_of_fp32_groups})
            if stage == 3:
                placed.update(_devices({"ds_tensor": [p.ds_tensor for p in model.parameters()]}))
            x, y = torch.zeros(2, IN, device=DEVICE), torch.zeros(2, OUT, device=DEVICE)
            for micro in range(2):
                engine.backward(torch.nn.functional.mse_loss(engine(x), y))
                if micro == 1:   # the boundary: reduced, the step to come
                    placed.update(_devices({"averaged_gradients": opt.averaged_gradients}))
                    _read_overflow_on_device(opt)
                engine.step()
            assert engine.global_steps == 1
            placed.update(_devices({"stepped param": list(model.parameters()), "grad norm": opt._global_grad_norm,
                                    "optimizer state": list(opt.optimizer.state.values())}))
            return placed, backend.calls

        return _on_device(run)
    return body


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_places_everything_on_the_rank_device(stage):
    """initialize() at ZeRO ``stage`` and one step of two micro-batches: parameters, flat buffers,
    fp32 masters, norm masks, reduced gradients, the norm, Adam's moments, and every tensor a
    collective moved are on the rank's device, and the forward ran on input there."""
    placed, calls = run_ranks(_zero_body(stage), world_size=1, tp=None)[0]
    for kind in ("averaged_gradients", "optimizer state", "grad norm"):
        assert any(name.startswith(kind) for name in placed), (kind, placed)
    assert {name: d for name, d in placed.items() if d != DEVICE} == {}
    assert "broadcast" in {name for name, _ in calls}
    assert [(name, devices) for name, devices in calls if set(devices) != {DEVICE}] == []


def _pipe_body(rank):
    from minitron.runtime import initialize
    from minitron.runtime.pipe import LayerSpec, PipelineModule, p2p

    def run(backend):
        layers = [LayerSpec(torch.nn.Linear, IN, 16), LayerSpec(torch.nn.Tanh), LayerSpec(torch.nn.Linear, 16, OUT)]
        module = PipelineModule(layers, num_stages=1, loss_fn=torch.nn.functional.mse_loss)
        placed = _devices({"built param": list(module.parameters())})   # before the engine moves it
        engine, *_ = initialize(model=module, config={**CONFIG, "zero_optimization": {"stage": 1}})
        engine.optimizer.has_overflow = lambda partitions: False   # the host read: see the ZeRO test
        g = torch.Generator().manual_seed(0)
        batches = [(torch.randn(2, IN, generator=g), torch.randn(2, OUT, generator=g)) for _ in range(2)]
        placed["train loss"] = str(engine.train_batch(iter(batches)).device)   # the loader's CPU batches moved
        placed.update(_devices({"param": list(module.parameters()),
                                "optimizer state": list(engine.optimizer.optimizer.state.values())}))
        # The shapes a stage announces to the next travel on the device too (nccl moves nothing else).
        p2p._grid = SimpleNamespace(pipe_parallel_size=2, get_stage_id=lambda: 0, stage_to_global=lambda stage_id: 0)
        try:
            p2p.send_tensor_meta((torch.zeros(2, 16, device=DEVICE),), 1)
        finally:
            p2p._grid = None
        return placed, backend.calls

    return _on_device(run)


def test_pipeline_engine_places_everything_on_the_rank_device():
    """A PipelineModule is on the rank's device once built; train_batch loads the loader's CPU
    micro-batches onto it and trains there; the tensor meta a stage sends is there too."""
    placed, calls = run_ranks(_pipe_body, world_size=1, tp=None)[0]
    assert any(name.startswith("optimizer state") for name in placed), placed
    assert {name: d for name, d in placed.items() if d != DEVICE} == {}
    assert [name for name, _ in calls].count("send") == 2
    assert [(name, devices) for name, devices in calls if set(devices) != {DEVICE}] == []
