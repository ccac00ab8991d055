"""zero_optimization's smaller knobs as DeepSpeed 0.19.8 acts on them, on 2 forked gloo ranks
(one launch, each case a traced span, two Adam steps of a three-linear net):

* stages 1-2: use_multi_rank_bucket_allreduce (a bucket all-reduced whole, or reduced onto each
  owner), compute_grad_norm false (no norm, one all-reduce fewer a step, no norm to read);
* stage 3: stage3_allgather_sequential (one all-gather per parameter),
  stage3_use_all_reduce_for_fetch_params (a module's gather as one all-reduce),
  enable_sanity_checks (two broadcasts before each gradient's reduce-scatter),
  log_trace_cache_warnings (a line where the trace breaks), leaf_module and
  stage3_module_granularity_threshold (a module gathered whole, with its descendants);
* ignore_unused_parameters false (an offloaded ZeRO-2 step stops on an unused parameter).

Each moves the same numbers by another route: losses and fp32 masters are bit-equal to the
default's (two ranks: every sum is a + b, whatever the collective), and the collectives
counted in the trace are the ones DeepSpeed's code makes.
"""
import contextlib
import io

import pytest
import torch

from distributed import run_ranks
from minitron.runtime import DeepSpeedConfig
from minitron.runtime.config_values import DeepSpeedConfigError
from minitron.trace.reader import load_trace

WORLD, IN, STEPS = 2, 16, 2
RUN = "zero_knobs.run"
PLAIN3 = {"stage": 3, "stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0,
          "stage3_max_reuse_distance": 0}
CASES = {
    # a bucket of 300 elements: the net's 3 x 272 parameters go in 3 buckets
    "stage2": {"stage": 2, "reduce_bucket_size": 300},
    "stage2_reduce": {"stage": 2, "reduce_bucket_size": 300, "use_multi_rank_bucket_allreduce": False},
    "stage1": {"stage": 1},
    "stage1_no_norm": {"stage": 1, "compute_grad_norm": False},   # (the run's gradient_clipping is 0)
    "zero3": PLAIN3,
    "sequential": {**PLAIN3, "stage3_allgather_sequential": True},
    "all_reduce": {**PLAIN3, "stage3_use_all_reduce_for_fetch_params": True},
    "sanity": {**PLAIN3, "enable_sanity_checks": True},
    "warn": {**PLAIN3, "log_trace_cache_warnings": True},
    # on Nested: its block gathered whole, by name or by granularity (block: 148 elements over
    # 2 + 1 layers, 49 a layer; the net: 692 over 6, 115), against module by module
    "nested": PLAIN3,
    "leaf": {**PLAIN3, "leaf_module": {"names": ["block"]}},
    "granular": {**PLAIN3, "stage3_module_granularity_threshold": 60},
}
NESTED = ("nested", "leaf", "granular")
PARAMS = 6   # three linears, a weight and a bias each


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down, self.head = (torch.nn.Linear(IN, IN) for _ in range(3))

    def forward(self, x, skip: bool = False):
        h = torch.tanh(self.up(x))
        return self.head(h if skip else torch.tanh(self.down(h)))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(IN, 4), torch.nn.Linear(4, IN)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


class Nested(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.up, self.block, self.head = torch.nn.Linear(IN, IN), Block(), torch.nn.Linear(IN, IN)

    def forward(self, x, skip: bool = False):
        return self.head(torch.tanh(self.block(torch.tanh(self.up(x)))))


def _runs(rank: int) -> dict:
    import torch.distributed as dist

    from minitron.runtime import initialize
    from minitron.trace import traced
    out = {}
    for name, zero in CASES.items():
        @traced(name=RUN, args=lambda name=name: {"case": name})
        def run():
            config = {"train_batch_size": 2 * WORLD, "zero_optimization": zero, "gradient_clipping": 0.0,
                      "optimizer": {"type": "Adam", "params": {"lr": 0.01}}}
            net = Nested() if name in NESTED else Net()
            engine, losses, norms, printed = initialize(model=net, config=config)[0], [], [], io.StringIO()
            # the "warn" case leaves its trace after the second pass (a forward without `down`)
            for k in range(STEPS + (1 if name == "warn" else 0)):
                g = torch.Generator().manual_seed(10 + k)
                x, y = torch.randn(2 * WORLD, IN, generator=g), torch.randn(2 * WORLD, IN, generator=g)
                with contextlib.redirect_stdout(printed):
                    loss = torch.nn.functional.mse_loss(engine(x[2 * rank:2 * rank + 2], skip=k == STEPS),
                                                        y[2 * rank:2 * rank + 2])
                engine.backward(loss)
                engine.step()
                total = torch.tensor([loss.item()])
                dist.all_reduce(total)
                losses.append(total.item())
                norms.append(engine.get_global_grad_norm())
            master = engine.optimizer.single_partition_of_fp32_groups[0].detach().clone()
            return {"losses": losses[:STEPS], "master": master, "norms": norms, "printed": printed.getvalue(),
                    "leaves": getattr(engine.optimizer, "leaf_modules", None)}
        out[name] = run()
    out["unused"] = {ignore: _unused_step(rank, ignore) for ignore in (True, False)}
    return out


def _unused_step(rank: int, ignore: bool) -> str:
    """One offloaded ZeRO-2 step of a net with a linear its forward never calls."""
    from minitron.runtime import initialize
    net = Net()
    # last in the flat buffer and larger than the rest: both ranks' partitions hold some of it,
    # so both stop (a rank that stepped on would wait for the other in the norm's all-reduce)
    net.spare = torch.nn.Linear(IN, 4 * IN)
    config = {"train_batch_size": 2 * WORLD, "gradient_clipping": 0.0,
              "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
              "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"},
                                    "ignore_unused_parameters": ignore}}
    engine = initialize(model=net, config=config)[0]
    engine.backward(engine(torch.ones(2, IN)).sum())
    try:
        engine.step()
    except RuntimeError as err:
        return str(err)
    return "stepped"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    where = tmp_path_factory.mktemp("zero_knobs")
    results = run_ranks(_runs, world_size=WORLD, tp=None, trace_dir=str(where))
    return results, load_trace(where)


def _calls(records: list, case: str) -> dict:
    """name -> count of one rank's torch.distributed calls inside the case's run."""
    run = next(r for r in records if r["name"] == RUN and r["args"]["case"] == case)
    out: dict = {}
    for r in records:
        if run["start_us"] <= r["start_us"] and r["end_us"] <= run["end_us"] and \
                r["name"].startswith("torch.distributed."):
            name = r["name"].rsplit(".", 1)[1]
            out[name] = out.get(name, 0) + 1
    return out


@pytest.mark.parametrize("case, plain", [("stage2_reduce", "stage2"), ("stage1_no_norm", "stage1"),
                                         ("sequential", "zero3"), ("all_reduce", "zero3"), ("sanity", "zero3"),
                                         ("leaf", "nested"), ("granular", "nested")])
def test_same_numbers_by_another_route(runs, case, plain):
    for rank in runs[0]:
        assert rank[case]["losses"] == rank[plain]["losses"]
        assert torch.equal(rank[case]["master"], rank[plain]["master"])


def test_bucket_all_reduced_whole_or_reduced_onto_owners(runs):
    """3 buckets a backward, 2 steps: 6 all-reduces of a bucket (DeepSpeed's default), or one
    reduce per owner of a bucket's elements instead (4 of the 6 buckets... each bucket's
    elements fall in one or both ranks' partitions)."""
    for records in runs[1].values():
        whole, owners = _calls(records, "stage2"), _calls(records, "stage2_reduce")
        assert "reduce" not in whole
        assert whole["all_reduce"] - owners["all_reduce"] == 3 * STEPS
        assert 3 * STEPS <= owners["reduce"] <= 2 * 3 * STEPS


def test_no_grad_norm_no_all_reduce(runs):
    for records in runs[1].values():
        assert _calls(records, "stage1")["all_reduce"] - _calls(records, "stage1_no_norm")["all_reduce"] == STEPS
    for rank in runs[0]:
        assert rank["stage1_no_norm"]["norms"] == [None] * STEPS
        assert all(n > 0 for n in rank["stage1"]["norms"])


def test_stage3_fetch_routes(runs):
    """Plain: one all-gather per module per pass (forward, backward). Sequential: one per
    parameter. All-reduce: each module's two parameters in one all-reduce (a one-parameter
    gather would stay an all-gather, as in DeepSpeed)."""
    for records in runs[1].values():
        plain, seq, red = (_calls(records, c) for c in ("zero3", "sequential", "all_reduce"))
        gathers = 3 * 2 * STEPS
        assert plain["all_gather_into_tensor"] == gathers
        assert seq["all_gather_into_tensor"] == 2 * gathers
        assert "all_gather_into_tensor" not in red and red["all_reduce"] == plain["all_reduce"] + gathers


def test_sanity_checks_broadcast_before_each_reduce(runs):
    for records in runs[1].values():
        plain, sane = _calls(records, "zero3"), _calls(records, "sanity")
        assert sane.get("broadcast", 0) - plain.get("broadcast", 0) == 2 * PARAMS * STEPS
        assert sane["reduce_scatter_tensor"] == plain["reduce_scatter_tensor"] == PARAMS * STEPS


def test_trace_cache_warning(runs):
    """The third pass skips `down`: the coordinator's complete trace expected it (rank 0 says so)."""
    zero, one = runs[0]
    assert zero["zero3"]["printed"] == ""
    # modules by DeepSpeed's numbering: 0 the net, 1 up, 2 down, 3 head; steps 0-1 were the net and up
    assert "Invalidate trace cache @ step 2: expected module 2 (Linear), but got module 3 (Linear)" \
        in zero["warn"]["printed"]
    assert one["warn"]["printed"] == ""


@pytest.mark.parametrize("zero, extra, message", [
    ({"stage": 3, "compute_grad_norm": False}, {}, "supported only with ZeRO stage 1 or 2"),
    ({"stage": 2, "compute_grad_norm": False}, {}, "requires gradient_clipping 0"),   # DeepSpeed's default: 1.0
    ({"stage": 2, "compute_grad_norm": False, "offload_optimizer": {"device": "cpu"}}, {"gradient_clipping": 0},
     "does not support offload_optimizer"),
    ({"stage": 1, "legacy_stage1": True}, {}, "before 0.5.9"),
    ({"stage": 3, "memory_efficient_linear": False}, {}, "implements only true"),
])
def test_refused_as_deepspeed_refuses(zero, extra, message):
    with pytest.raises(DeepSpeedConfigError, match=message):
        DeepSpeedConfig({"train_batch_size": 4, "zero_optimization": zero, **extra}, world_size=2)


def test_accepted_where_nothing_reads_them():
    """legacy_stage1 at stage 0 (DeepSpeed reads it only when building a ZeRO optimizer);
    override_module_apply either way (read inside zero.Init only)."""
    for zero in ({"stage": 0, "legacy_stage1": True}, {"stage": 3, "override_module_apply": False}):
        notes = DeepSpeedConfig({"train_batch_size": 4, "zero_optimization": zero}, world_size=2).as_dict()["no_effect"]
        # ds-config prints why a key changes nothing; override_module_apply is one
        assert ("zero_optimization.override_module_apply" in notes) == ("override_module_apply" in zero)


def test_leaf_modules_are_gathered_whole(runs):
    """Nested's modules with parameters: up, block.a, block.b, head, each gathered before its
    forward and its backward; a leaf block is one gather of both its linears, and its
    children get no hooks."""
    for rank in runs[0]:
        assert rank["nested"]["leaves"] == []
        assert rank["leaf"]["leaves"] == rank["granular"]["leaves"] == ["block"]
    for records in runs[1].values():
        per_step = {case: _calls(records, case)["all_gather_into_tensor"] // STEPS for case in NESTED}
        assert per_step == {"nested": 8, "leaf": 6, "granular": 6}


def test_unused_parameters_stop_an_offloaded_step_when_asked(runs):
    """DeepSpeed asserts where its offloaded norm finds a parameter of the rank's partition
    without a gradient: here the spare linear, which both ranks' partitions hold a part of."""
    for rank in runs[0]:
        assert rank["unused"][True] == "stepped"
        assert "a parameter of shape (64, 16) was not used in producing the loss" in rank["unused"][False]

