"""pipeline.activation_checkpoint_interval held against DeepSpeed 0.19.8's own PipelineEngine
(marked deepspeed): test_ds_pipe_peer.py's toy pipeline on two forked gloo ranks, trained with the
section's interval 1 by both engines, gives the same losses and the same stage split."""

import pytest
import torch

from distributed import run_ranks
from deepspeed_child import NEEDS_DEEPSPEED
from test_ds_pipe_peer import BATCHES, CONFIG, data, loss_fn, specs

pytestmark = NEEDS_DEEPSPEED
PIPELINE = {"activation_checkpoint_interval": 1, "stages": 4, "partition": "uniform", "seed_layers": True}


def _body(rank):
    import deepspeed   # in the ranks only: the tests' parent process stays free of DeepSpeed
    import deepspeed.pipe
    import minitron.runtime.pipe
    from minitron import comm
    from minitron.runtime import initialize
    deepspeed.init_distributed(dist_backend="gloo")
    comm.init_distributed()
    out = {}
    for name, pipe, init in (("deepspeed", deepspeed.pipe, deepspeed.initialize),
                             ("minitron", minitron.runtime.pipe, initialize)):
        module = pipe.PipelineModule(specs(pipe), num_stages=2, loss_fn=loss_fn)
        engine, *_ = init(model=module, optimizer=torch.optim.SGD(list(module.parameters()), lr=0.1),
                          config={**CONFIG, "pipeline": PIPELINE})
        losses = [float(engine.train_batch(iter(data()))) for _ in range(BATCHES)]
        out[name] = {"parts": list(module.parts), "interval": module.activation_checkpoint_interval,
                     "losses": losses}
    return out


def test_same_losses_with_checkpointed_stages():
    for both in run_ranks(_body, world_size=2, tp=None):
        assert both["minitron"]["parts"] == both["deepspeed"]["parts"] == [0, 3, 5]
        assert both["minitron"]["interval"] == both["deepspeed"]["interval"] == 1
        # float32, the same operations in the same order: 1e-6 is rounding
        assert both["minitron"]["losses"] == pytest.approx(both["deepspeed"]["losses"], abs=1e-6)
