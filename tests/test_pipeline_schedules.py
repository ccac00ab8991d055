"""The three schedules give the serial model's losses and gradients, on a toy stack of layers.

Layer i of the toy model is tanh(W_i h + b_i), initialised from seed i, so any split of the
layers into stages (and chunks) rebuilds exactly the serial weights. Stages read (x, y)
micro-batches from identical iterators; only the first uses x and only the last uses y.
"""

from functools import partial
from types import SimpleNamespace

import pytest
import torch

from distributed import run_ranks

HIDDEN, SEQ, MICRO, LAYERS, MICROBATCHES = 8, 4, 2, 8, 4


def make_layer(i):
    torch.manual_seed(1000 + i)
    return torch.nn.Linear(HIDDEN, HIDDEN)


def batches(n):
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(SEQ, MICRO, HIDDEN, generator=g), torch.randn(SEQ, MICRO, HIDDEN, generator=g))
            for _ in range(n)]


class ToyStage(torch.nn.Module):
    def __init__(self, layer_ids, pre_process, post_process, vp_stage=None):
        super().__init__()
        self.config = SimpleNamespace(hidden_size=HIDDEN, sequence_parallel=False, grad_scale_func=None,
                                      no_sync_func=None, finalize_model_grads_func=None,
                                      deallocate_pipeline_outputs=True, pipeline_dtype=torch.float32)
        self.layer_ids = list(layer_ids)
        self.layers = torch.nn.ModuleList(make_layer(i) for i in self.layer_ids)
        self.pre_process, self.post_process = pre_process, post_process
        self.vp_stage = vp_stage
        self.input_tensor = None

    def set_input_tensor(self, tensor):
        self.input_tensor = tensor

    def forward(self, x):
        h = x if self.pre_process else self.input_tensor
        for layer in self.layers:
            h = torch.tanh(layer(h))
        return h


def loss_func(y, output):
    loss = torch.nn.functional.mse_loss(output, y)
    return loss, {"loss": loss.detach()}


def forward_step(data_iterator, model):
    from minitron.core import parallel_state as mpu
    # Like GPT's get_batch: only the stages that use data read it (first: x, last: y). With a
    # virtual pipeline, "stage" means this model chunk: vp_stage names it.
    ask = dict(ignore_virtual=model.vp_stage is None, vp_stage=model.vp_stage)
    x, y = next(data_iterator) if (mpu.is_pipeline_first_stage(**ask) or mpu.is_pipeline_last_stage(**ask)) \
        else (None, None)
    return model(x), partial(loss_func, y)


def serial_reference():
    model = ToyStage(range(LAYERS), True, True)
    losses = []
    for x, y in batches(MICROBATCHES):
        loss, _ = loss_func(y, model(x))
        (loss / MICROBATCHES).backward()
        losses.append(loss.item())
    return losses, {i: (l.weight.grad.clone(), l.bias.grad.clone()) for i, l in zip(model.layer_ids, model.layers)}


def pipeline_body(pp, vp, forward_only=False):
    def body(rank):
        from minitron.core import parallel_state as mpu
        from minitron.core.pipeline_parallel import get_forward_backward_func

        stage = mpu.get_pipeline_model_parallel_rank()
        chunks = vp or 1
        per_chunk = LAYERS // (pp * chunks)
        model = []
        for c in range(chunks):
            vp_stage = c if vp else None
            first = c * pp * per_chunk + stage * per_chunk  # Megatron's layer offset with a virtual pipeline
            model.append(ToyStage(range(first, first + per_chunk),
                                  mpu.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
                                  mpu.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage), vp_stage))
        losses = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(batches(MICROBATCHES)),
            model=model if vp else model[0], num_microbatches=MICROBATCHES, seq_length=SEQ,
            micro_batch_size=MICRO, forward_only=forward_only)
        grads = {} if forward_only else {
            i: (l.weight.grad, l.bias.grad) for m in model for i, l in zip(m.layer_ids, m.layers)}
        return [d["loss"].item() for d in losses], grads
    return body


@pytest.mark.parametrize("pp,vp", [(1, None), (2, None), (4, None), (2, 2), (4, 2)])
def test_schedule_matches_serial(pp, vp):
    ref_losses, ref_grads = serial_reference()
    results = run_ranks(pipeline_body(pp, vp), world_size=pp, tp=1, pp=pp, vp=vp)
    last = results[pp - 1]
    assert last[0] == pytest.approx(ref_losses, rel=1e-6)  # the last stage saw every micro-batch's loss
    seen = {}
    for _, grads in results:
        seen.update(grads)
    assert sorted(seen) == list(range(LAYERS))  # every layer lives on exactly one stage
    for i, (w, b) in seen.items():
        torch.testing.assert_close(w, ref_grads[i][0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b, ref_grads[i][1], rtol=1e-5, atol=1e-6)


def test_forward_only_1f1b():
    ref_losses, _ = serial_reference()
    results = run_ranks(pipeline_body(4, None, forward_only=True), world_size=4, tp=1, pp=4)
    assert results[3][0] == pytest.approx(ref_losses, rel=1e-6)
    assert results[0][0] == []  # only the last stage computes the loss
