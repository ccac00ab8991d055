"""The ds_config's pipeline section (runtime/config_pipeline.py) as DeepSpeed 0.19.8's
PipelineEngine reads it: activation_checkpoint_interval overrides the module's and makes each
stage recompute its chunks of layers in backward, with the first stage's inputs made to require
grad so its first chunk still gets gradients; stages, partition and seed_layers are read by no
engine; pipe/grad_partitioned must be bools.

Two forked gloo ranks run test_ds_pipe_peer.py's toy pipeline (a tied embedding and head, two
Linears, a tanh) three batches of three micro-batches with the interval 0 and 1; both must give
the serial model's losses, and only the second goes through the checkpoint function.
"""

import pytest

from distributed import run_ranks
from minitron.runtime.config import DeepSpeedConfig
from minitron.runtime.config_features import no_effect_notes
from minitron.runtime.config_values import DeepSpeedConfigError
from test_ds_pipe_peer import BATCHES, CONFIG, MICRO, data, loss_fn, serial_losses, specs


def _body(rank: int) -> dict:
    import torch
    import minitron.runtime.pipe as pipe
    from minitron.runtime import initialize
    from minitron import comm
    from minitron.runtime.activation_checkpointing import checkpointing
    comm.init_distributed()   # the module makes its groups before initialize() does
    out = {}
    for interval in (0, 1):
        calls = []

        def counted(function, *args):
            calls.append(len(args))
            return checkpointing.checkpoint(function, *args)

        module = pipe.PipelineModule(specs(pipe), num_stages=2, loss_fn=loss_fn, activation_checkpoint_func=counted)
        config = {**CONFIG, "pipeline": {"activation_checkpoint_interval": interval, "stages": 4,
                                         "partition": "uniform", "seed_layers": True}}
        engine, *_ = initialize(model=module, optimizer=torch.optim.SGD(list(module.parameters()), lr=0.1),
                                config=config)
        losses = [float(engine.train_batch(iter(data()))) for _ in range(BATCHES)]
        out[interval] = {"parts": list(module.parts), "calls": len(calls), "losses": losses}
    return out


@pytest.fixture(scope="module")
def runs():
    return run_ranks(_body, world_size=2, tp=None)


def test_checkpointed_chunks_give_the_serial_losses(runs):
    serial = serial_losses()
    for stage, out in enumerate(runs):
        for interval in (0, 1):   # float32 the same sums in the same order: 1e-6 is rounding
            assert out[interval]["losses"] == pytest.approx(serial, abs=1e-6)
        assert out[0]["calls"] == 0
        # per micro-batch forward, the chunks with parameters: stage 0 the embedding and a Linear
        # (the tanh runs plainly), stage 1 a Linear (the head is a function around the tied
        # module, no nn.Module, so DeepSpeed's rule does not checkpoint it either)
        assert out[1]["calls"] == (2, 1)[stage] * MICRO * BATCHES


def test_stages_partition_seed_layers_change_nothing(runs):
    for out in runs:   # stages 4, partition "uniform": the module's own 2 stages, by parameters
        assert out[0]["parts"] == out[1]["parts"] == [0, 3, 5]
    notes = no_effect_notes({"pipeline": {"stages": 2, "partition": "uniform", "seed_layers": True}})
    assert {k for k in notes if k.startswith("pipeline.")} == {"pipeline.stages", "pipeline.partition",
                                                               "pipeline.seed_layers"}


def test_defaults_as_deepspeed():
    assert DeepSpeedConfig(CONFIG, world_size=1).pipeline == {
        "stages": "auto", "partition": "best", "seed_layers": False, "activation_checkpoint_interval": 0,
        "pipe_partitioned": True, "grad_partitioned": True, "use_reentrant": True}


@pytest.mark.parametrize("section, words", [
    ({"pipe_partitioned": "yes"}, "pipeline.pipe_partitioned must be true or false"),
    ({"grad_partitioned": 1}, "pipeline.grad_partitioned must be true or false"),
    ({"activation_checkpoint_interval": "2"}, "whole number of layers"),
    ({"use_reentrant": False}, "non_reentrant_checkpoint"),
    ({"stage": 2}, "stage"),
    ([], "pipeline must be an object"),
])
def test_refused_in_one_line(section, words):
    with pytest.raises(DeepSpeedConfigError) as refused:
        DeepSpeedConfig({**CONFIG, "pipeline": section}, world_size=1)
    assert words in str(refused.value) and "\n" not in str(refused.value)
