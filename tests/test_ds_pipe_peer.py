"""DeepSpeed 0.19.8's own PipelineEngine and minitron's, on the same toy PipelineModule, in the
same forked gloo ranks: the same partition, and the same loss for every batch (marked deepspeed).

The toy is the smallest model with everything a pipeline needs: a tied weight used at both ends
(an "embedding" and, through ``forward_fn``, a "head"), parameter-balanced partitioning by
``num_stages`` alone (DeepSpeed's default PipeDataParallelTopology), a plain function as a layer,
and a loss_fn. Both engines get a torch SGD and no clipping, so nothing but the pipeline differs;
without DeepSpeed's pipeline, the serial loop at the bottom gives the numbers both must match.
"""

import os

import pytest
import torch

from distributed import run_ranks
from deepspeed_child import NEEDS_DEEPSPEED

pytestmark = NEEDS_DEEPSPEED
os.environ.setdefault("DS_ACCELERATOR", "cpu")   # the forked ranks inherit it

BATCHES, MICRO = 3, 3
CONFIG = {"train_batch_size": MICRO, "train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0.0}


class Embed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(6, 4, generator=torch.Generator().manual_seed(0)))

    def forward(self, x):
        return x @ self.weight.t()


def head(module, hidden):
    return hidden @ module.weight


class Linear(torch.nn.Linear):
    def __init__(self, seed: int):
        torch.manual_seed(seed)
        super().__init__(6, 6)


def loss_fn(out, target):
    return torch.nn.functional.mse_loss(out, target)


def data(dp_rank: int = 0, micro: int = MICRO):
    g = torch.Generator().manual_seed(5 + dp_rank)
    return [(torch.randn(2, 4, generator=g), torch.randn(2, 4, generator=g)) for _ in range(micro)]


def specs(pipe):
    return [pipe.TiedLayerSpec("e", Embed), pipe.LayerSpec(Linear, 1), torch.tanh, pipe.LayerSpec(Linear, 2),
            pipe.TiedLayerSpec("e", Embed, forward_fn=head)]


def _train(dp: int):
    def body(rank):
        # In the ranks only: the tests' parent process stays free of DeepSpeed.
        import deepspeed
        import deepspeed.pipe
        import minitron.runtime.pipe
        from minitron import comm
        from minitron.runtime import initialize

        out = {}
        deepspeed.init_distributed(dist_backend="gloo")
        comm.init_distributed()
        config = {**CONFIG, "train_batch_size": MICRO * dp}
        for name, pipe, init in (("deepspeed", deepspeed.pipe, deepspeed.initialize),
                                 ("minitron", minitron.runtime.pipe, initialize)):
            module = pipe.PipelineModule(specs(pipe), num_stages=2, loss_fn=loss_fn)
            engine, *_ = init(model=module, optimizer=torch.optim.SGD(
                [p for p in module.parameters()], lr=0.1), config=config)
            batches = data(engine.grid.get_data_parallel_rank())
            out[name] = {"parts": list(module.parts),
                         "losses": [float(engine.train_batch(iter(batches))) for _ in range(BATCHES)]}
        return out
    return body


def serial_losses() -> list[float]:
    """The same model in one process: each batch the mean of the micro-batches' losses."""
    embed, layers = Embed(), [Linear(1), torch.tanh, Linear(2)]
    params = [embed.weight] + [p for layer in layers if isinstance(layer, torch.nn.Module) for p in layer.parameters()]
    optimizer, losses, batches = torch.optim.SGD(params, lr=0.1), [], data()
    for _ in range(BATCHES):
        total = 0.0
        for x, y in batches:
            hidden = embed(x)
            for layer in layers:
                hidden = layer(hidden)
            loss = loss_fn(head(embed, hidden), y) / MICRO
            loss.backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    return losses


@pytest.mark.parametrize("dp", [1, 2])
def test_pipeline_engines_agree(dp):
    """Two stages, on one or two data-parallel replicas (each its own micro-batches)."""
    results = run_ranks(_train(dp), world_size=2 * dp, tp=None)
    for rank, both in enumerate(results):
        assert both["minitron"]["parts"] == both["deepspeed"]["parts"] == [0, 3, 5]
        assert both["minitron"]["losses"] == pytest.approx(both["deepspeed"]["losses"], abs=1e-6), rank
        if dp == 1:
            assert both["minitron"]["losses"] == pytest.approx(serial_losses(), abs=1e-6), rank
        assert both["minitron"]["losses"][-1] < both["minitron"]["losses"][0]   # it learns
