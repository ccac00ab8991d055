"""The interleaved schedule at any number of micro-batches (Megatron 0.19's schedule table).

Micro-batches cross the model chunks in groups of --microbatch-group-size-per-virtual-pipeline-
stage (default pp); the last group takes the rest. Each run here must give the serial model's
losses and gradients, on the toy stack of test_pipeline_schedules (layer i seeded by i).
"""

import pytest
import torch

from distributed import run_ranks
from test_pipeline_schedules import LAYERS, MICRO, SEQ, ToyStage, batches, forward_step, loss_func

from minitron.core.pipeline_parallel.pp_rank_microbatches import (
    check_microbatch_group_size, get_pp_rank_microbatches, get_schedule_table,
)


def test_schedule_table_is_megatrons_example():
    # pp 2, v 2, groups of 3, five micro-batches: Megatron's own worked example.
    table = get_schedule_table(5, 2, 3)
    assert [mb for mb, _ in table] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [c for _, c in table] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]
    # the default groups of pp with a multiple of pp: the pre-0.19 order
    assert get_schedule_table(4, 2, 2) == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (3, 0), (2, 1), (3, 1)]


@pytest.mark.parametrize("m,pp,n,bad", [(3, 2, 2, "last group of 1"), (3, 2, 4, "[pipeline size 2"),
                                        (5, 4, 1, "[pipeline size 4"), (6, 4, 4, "last group of 2")])
def test_group_size_refusals(m, pp, n, bad):
    assert bad in check_microbatch_group_size(m, pp, n)


def test_group_size_accepted():
    assert [check_microbatch_group_size(m, pp, n) for m, pp, n in [(3, 2, 3), (5, 2, 3), (4, 2, 2), (6, 4, 6)]] \
        == [None] * 4


def test_warmup_counts_follow_megatron_019():
    # 0.19 drops the "exactly pp micro-batches: all warm-up" rule; the last rank gets a steady state.
    counts = [get_pp_rank_microbatches(2, 2, 2, pipeline_parallel_size=2, pipeline_parallel_rank=r,
                                       virtual_pipeline_parallel_size=2)[2] for r in (0, 1)]
    assert counts == [4, 2]


def serial(num_microbatches):
    model = ToyStage(range(LAYERS), True, True)
    losses = []
    for x, y in batches(num_microbatches):
        loss, _ = loss_func(y, model(x))
        (loss / num_microbatches).backward()
        losses.append(loss.item())
    return losses, {i: (l.weight.grad.clone(), l.bias.grad.clone()) for i, l in zip(model.layer_ids, model.layers)}


def interleaved_body(pp, vp, num_microbatches, group_size, forward_only):
    def body(rank):
        from minitron.core import parallel_state as mpu
        from minitron.core.pipeline_parallel import get_forward_backward_func

        stage, per_chunk = mpu.get_pipeline_model_parallel_rank(), LAYERS // (pp * vp)
        model = []
        for c in range(vp):
            first = c * pp * per_chunk + stage * per_chunk
            chunk = ToyStage(range(first, first + per_chunk), mpu.is_pipeline_first_stage(ignore_virtual=False, vp_stage=c),
                             mpu.is_pipeline_last_stage(ignore_virtual=False, vp_stage=c), c)
            chunk.config.microbatch_group_size_per_vp_stage = group_size
            model.append(chunk)
        losses = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(batches(num_microbatches)), model=model,
            num_microbatches=num_microbatches, seq_length=SEQ, micro_batch_size=MICRO, forward_only=forward_only)
        grads = {} if forward_only else {i: (l.weight.grad, l.bias.grad) for m in model
                                         for i, l in zip(m.layer_ids, m.layers)}
        return [d["loss"].item() for d in losses], grads
    return body


# (pp, vp, micro-batches, group size): 3 and 5 are no multiple of pp 2; 6 on pp 4 neither; 2 = pp
# is the case the pre-0.19 count made all warm-up.
@pytest.mark.parametrize("pp,vp,m,n,forward_only", [(2, 2, 3, 3, False), (2, 2, 5, 3, False), (2, 2, 2, 2, False),
                                                     (4, 2, 6, 6, False), (2, 2, 3, 3, True)])
def test_interleaved_matches_serial(pp, vp, m, n, forward_only):
    ref_losses, ref_grads = serial(m)
    results = run_ranks(interleaved_body(pp, vp, m, n, forward_only), world_size=pp, tp=1, pp=pp, vp=vp)
    assert results[-1][0] == pytest.approx(ref_losses, rel=1e-6)
    seen = {}
    for _, grads in results:
        seen.update(grads)
    if forward_only:
        assert seen == {}
        return
    assert sorted(seen) == list(range(LAYERS))
    for i, (w, b) in seen.items():
        torch.testing.assert_close(w, ref_grads[i][0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b, ref_grads[i][1], rtol=1e-5, atol=1e-6)


def _validated(*flags):
    from minitron.training.arguments import build_parser, validate_args
    args = build_parser().parse_args(["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
                                      "--seq-length", "16", "--micro-batch-size", "1", "--train-iters", "1",
                                      "--lr", "1e-3", "--mock-data", "--pipeline-model-parallel-size", "2",
                                      "--num-virtual-stages-per-pipeline-rank", "2", *flags])
    args.world_size, args.rank = 2, 0
    return validate_args(args)


def test_validate_args_takes_megatrons_group_size():
    from minitron.training.arguments import ArgumentError
    assert _validated("--global-batch-size", "4").microbatch_group_size_per_vp_stage == 2   # default: pp
    assert _validated("--global-batch-size", "3", "--microbatch-group-size-per-virtual-pipeline-stage",
                      "3").microbatch_group_size_per_vp_stage == 3
    with pytest.raises(ArgumentError, match="last group of 1"):
        _validated("--global-batch-size", "3")


def test_the_estimate_holds_the_chunks_the_table_runs():
    from types import SimpleNamespace
    from minitron.training.theoretical_activations import in_flight_chunks
    args = SimpleNamespace(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2,
                           microbatch_group_size_per_vp_stage=3)
    # rank 0: 2 + (2 - 1) x 3 = 5 warm-up forwards and the first steady one, in the table's order
    assert in_flight_chunks(args, 0, 3) == [0, 0, 0, 1, 1, 1]
