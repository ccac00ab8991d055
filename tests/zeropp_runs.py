"""The runs of tests/zeropp_cases.py on minitron's engine, each inside a traced span named after
its case, each step inside one too."""
import os

import torch

from zeropp_cases import BACKWARD, CASES, IN, MOVES, NODE, RUN, STEP, STEPS, WORLD  # noqa: F401 -- re-exported


class Net(torch.nn.Module):
    """Sizes whose dp pieces are multiples of 8 (qwZ's blocks) and whose matrices qgZ takes."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down, self.head = torch.nn.Linear(IN, 64), torch.nn.Linear(64, IN), torch.nn.Linear(IN, IN)

    def forward(self, x):
        return self.head(torch.tanh(self.down(torch.tanh(self.up(x)))))


def modules(net: "Net") -> list:
    """Per module, its parameters in the order stage 3 gathers them."""
    return [list(m.parameters()) for m in (net.up, net.down, net.head)]


def config(zero: dict, torch_adam: bool = False) -> dict:
    """``torch_adam``: torch's AdamW rather than DeepSpeed's FusedAdam, which DeepSpeed's CPU
    accelerator would first compile (the peer test asks for it). Its weight decay is spelled
    out: DeepSpeed hands torch's AdamW only the keys given, so torch's default (0.01) would
    apply there, where minitron passes FusedAdam's (0)."""
    adam = {"lr": 0.01, **({"torch_adam": True, "weight_decay": 0.0} if torch_adam else {})}
    return {"train_batch_size": 2 * WORLD, "zero_optimization": zero, "optimizer": {"type": "Adam", "params": adam}}


def train(engine, rank: int, grads: list | None = None) -> list:
    """The losses of every rank's micro-batch, averaged over the ranks, step by step, each step
    in a traced span; ``grads`` gets the first step's reduced gradient partition (minitron's)."""
    from minitron.trace import traced
    step = traced(name=STEP, args=lambda engine, rank, k, grads: {"step": k})(_step)
    return [step(engine, rank, k, grads) for k in range(STEPS)]


def _step(engine, rank: int, k: int, grads) -> float:
    import torch.distributed as dist

    from minitron.trace import traced
    g = torch.Generator().manual_seed(10 + k)
    x, y = torch.randn(2 * WORLD, IN, generator=g), torch.randn(2 * WORLD, IN, generator=g)
    rows = slice(2 * rank, 2 * rank + 2)
    loss = torch.nn.functional.mse_loss(engine(x[rows]), y[rows])
    traced(name=BACKWARD, args=lambda loss: {})(engine.backward)(loss)   # a span the peer test reads
    if grads is not None and k == 0:
        grads.append(engine.optimizer.averaged_gradients[0].clone())
    engine.step()
    total = torch.tensor([loss.item()])
    dist.all_reduce(total)
    return total.item() / WORLD


def minitron_runs(rank: int) -> dict:
    """Each case: its losses, the first step's gradient partition, and my fp32 master partition
    after the steps."""
    from minitron.runtime import initialize
    from minitron.trace import traced
    os.environ["LOCAL_SIZE"] = str(NODE)
    out = {}
    for name, zero in CASES.items():
        @traced(name=RUN, args=lambda name=name: {"case": name})
        def run():
            engine, grads = initialize(model=Net(), config=config(zero))[0], []
            return {"losses": train(engine, rank, grads), "grad": grads[0],
                    "master": engine.optimizer.single_partition_of_fp32_groups[0].detach().clone()}
        out[name] = run()
    return out


def _within(records: list, span: dict) -> list:
    return [r for r in records if span["start_us"] <= r["start_us"] and r["end_us"] <= span["end_us"]]


def step_tallies(records: list, case: str) -> list:
    """One rank's gathers and gradient reductions in each step of a case's run: per step,
    {"GROUP dtype": [bytes handed to the calls, calls]} (bytes: cli/views/diff.py's call_bytes)."""
    from minitron.cli.views.diff import call_bytes, group_key
    run = next(r for r in records if r["name"] == RUN and r["args"]["case"] == case)
    out = []
    for span in (r for r in _within(records, run) if r["name"] == STEP):
        tally: dict = {}
        for r in _within(records, span):
            if r["name"] in MOVES:
                entry = tally.setdefault(f"{group_key(r['args'])} {r['args']['dtype']}", [0, 0])
                entry[0] += call_bytes(r)
                entry[1] += 1
        out.append(dict(sorted(tally.items())))
    return out
