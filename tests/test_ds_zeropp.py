"""ZeRO++ (hpZ, qwZ, qgZ) and stage 3's knobs (persistence, prefetch, reuse distance) on 4 forked
gloo ranks faked as 2 nodes of 2 (tests/zeropp_runs.py: one launch, every case in it, traced).

* hpZ, persistence, prefetch and reuse move the same numbers by other routes: losses, gradients
  and fp32 masters are bit-equal to plain ZeRO-3's.
* qwZ rounds the gathered weights to int8 blocks and qgZ the gradients to int4: the losses stay
  within a stated tolerance of plain ZeRO-3's.
* Each run's gathers and gradient reductions, group by group, equal in bytes and calls what
  training/theoretical_zeropp.py (minitron estimate's arithmetic) says, for the run's two steps.
* The quantizer against DeepSpeed's kernels as their source states them (DeepSpeed runs them on
  CUDA only, so no peer can): codes, scales, rounding, int4 packing, block counts, swizzle.
The same runs against DeepSpeed 0.19.8 itself are in test_ds_zeropp_peer.py.
"""
import pytest
import torch

from distributed import run_ranks
from minitron.ops.quantizer.quantizer import dequantize, pack_int4, quantize, unpack_int4, weight_groups
from minitron.runtime.comm.coalesced_collectives import swizzle_slots
from minitron.trace.reader import load_trace
from minitron.training.theoretical_comm import _Tally
from minitron.training.theoretical_zeropp import stage3_comm
from zeropp_runs import CASES, MOVES, NODE, RUN, STEPS, WORLD, Net, minitron_runs, modules, step_tallies


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    where = tmp_path_factory.mktemp("zeropp")
    results = run_ranks(minitron_runs, world_size=WORLD, tp=None, trace_dir=str(where))
    return results, load_trace(where)


def _calls(records: list, case: str) -> list:
    """The collectives of one case's run, in order."""
    run = next(r for r in records if r["name"] == RUN and r["args"]["case"] == case)
    return [r for r in records if run["start_us"] <= r["start_us"] and r["end_us"] <= run["end_us"]
            and r["name"] in MOVES]


@pytest.mark.parametrize("case", ["hpz", "persist", "prefetch", "reuse"])
def test_same_numbers_by_other_routes(runs, case):
    for rank in runs[0]:
        mine, plain = rank[case], rank["zero3"]
        assert mine["losses"] == plain["losses"]
        assert torch.equal(mine["grad"], plain["grad"]) and torch.equal(mine["master"], plain["master"])


# Measured relative differences from plain ZeRO-3's losses over the two steps: qwZ 8e-4, qgZ
# 1.2e-3, all three 1.5e-3. The first loss is computed before any update from weights gathered
# in int8 (qwZ: each off by at most 1/128 of its block's largest), the second after one Adam step
# taken on int4-rounded gradients (qgZ: off by up to 1/8 of a block's largest, which Adam's
# per-element normalisation turns into a step of the same sign, about the same size). 5e-3 is
# a few times what was measured and far below the loss's own move in one step (6%).
@pytest.mark.parametrize("case", ["qwz", "qgz", "zeropp"])
def test_quantized_losses_stay_close(runs, case):
    for rank in runs[0]:
        mine, plain = rank[case]["losses"], rank["zero3"]["losses"]
        assert mine != plain
        assert mine == pytest.approx(plain, rel=5e-3)


def test_qgz_hands_matrices_a_sum_over_nodes(runs):
    """DeepSpeed's all_to_all_quant_reduce sums a matrix's gradient over every rank and divides
    by the number of nodes: NODE times the mean plain ZeRO-3 takes. 1-D gradients take the
    fallback, the plain reduce-scatter: the same mean, bit for bit."""
    net = Net()
    pieces = [-(-p.numel() // WORLD) for ps in modules(net) for p in ps]
    matrix = [p.dim() > 1 for ps in modules(net) for p in ps]
    for rank in runs[0]:
        qgz, plain, offset = rank["qgz"]["grad"], rank["zero3"]["grad"], 0
        for piece, is_matrix in zip(pieces, matrix):
            mine, mean = qgz[offset:offset + piece], plain[offset:offset + piece]
            if is_matrix:   # int4 twice (node, then nodes): within 2 steps of 1/8 of the block's largest
                assert (mine - NODE * mean).abs().max() <= 2 * NODE * mean.abs().max() / 8
            else:
                assert torch.equal(mine, mean)
            offset += piece


@pytest.mark.parametrize("case", ["zero3", "hpz", "qwz", "qgz", "zeropp"])
def test_trace_bytes_equal_the_estimate(runs, case):
    """Every rank's gathers and gradient reductions, by group, in bytes and calls: the run's
    first step (the secondary pieces cut at initialization serve its first forward) and second."""
    zero = CASES[case]
    net = Net()
    gathers = [[-(-p.numel() // WORLD) for p in ps] for ps in modules(net)]
    shapes = [tuple(p.shape) for ps in modules(net) for p in ps]
    for records in runs[1].values():
        for step, measured in enumerate(step_tallies(records, case)):
            expected, by_group = _Tally(), {}
            stage3_comm(expected, gathers, shapes, dp=WORLD, e=4, m=1, dp_key="world",
                        hpz=zero.get("zero_hpz_partition_size", 1), local=NODE, first_step=step == 0,
                        quantized_weights=zero.get("zero_quantized_weights", False),
                        quantized_gradients=zero.get("zero_quantized_gradients", False))
            for key, (nbytes, calls) in measured.items():   # the estimate counts by group, dtypes together
                entry = by_group.setdefault(key.split()[0], [0, 0])
                entry[0] += nbytes
                entry[1] += calls
            assert by_group == expected, (case, step)


def test_knobs_show_on_the_trace(runs):
    """persist: after each step the three biases (64 elements or fewer) are gathered one by one;
    prefetch: from the second pass on, 3 gathers (forward, two of them with the next modules'
    parameters ahead) where plain ZeRO-3 makes 6; reuse: from the second pass on, backward gathers
    nothing, the forward having kept every weight. test_ds_zeropp_peer.py finds each sequence in
    DeepSpeed's own trace."""
    records = runs[1][0]
    gathers = lambda case: [r["args"]["shape"] for r in _calls(records, case)   # noqa: E731
                            if r["name"].endswith("all_gather_into_tensor")]
    plain = gathers("zero3")
    assert len(plain) == 6 * STEPS
    persist = gathers("persist")
    assert persist[-3:] == [[64 // WORLD], [32 // WORLD], [32 // WORLD]] and len(persist) == len(plain) + 3 * STEPS
    assert len(gathers("prefetch")) == 6 + 3
    assert len(gathers("reuse")) == 6 + 3   # 3 modules; pass 1: forward and backward; pass 2: forward only


# --- the quantizer, held against DeepSpeed's kernels as their source states them -----------------

def test_codes_and_scales_follow_the_kernel():
    """quantization_utils.h, symmetric: factor 2^bits / (2 max), codes rint(x * factor) clipped
    to [-2^(bits-1), 2^(bits-1) - 1], stored scale 1 / factor; a zero block uses factor 1."""
    x = torch.tensor([1.0, -0.5, 0.25, 0.0, 0.0, 0.0, 0.0, 0.0])
    codes, scales = quantize(x, 2, 8)
    assert codes.tolist() == [127, -64, 32, 0, 0, 0, 0, 0]   # 1.0 * 128 clips to 127
    assert scales.tolist() == [1 / 128, 1.0]
    # __float2int_rn rounds half to even: 2.5 -> 2, 3.5 -> 4 (max 4, int4: factor 16/8 = 2)
    codes, scales = quantize(torch.tensor([1.25, 1.75, 4.0, -4.0]), 1, 4)
    assert unpack_int4(codes).tolist() == [2, 4, 7, -8]
    assert dequantize(codes, scales, 4).tolist() == [1.0, 2.0, 3.5, -4.0]


def test_int4_packs_two_to_a_byte_first_in_the_upper_nibble():
    """PackedInt4 {int8_t high : 4; int8_t low : 4;} filled {second, first}: with GCC's
    little-endian bit-fields the first field takes the low bits, so the first value lands in
    the upper nibble."""
    assert pack_int4(torch.tensor([1, 2, -8, 7], dtype=torch.int8)).view(torch.uint8).tolist() == [0x12, 0x87]
    values = torch.arange(-8, 8, dtype=torch.int8)
    assert torch.equal(unpack_int4(pack_int4(values)), values)


def test_weight_blocks_and_swizzle():
    """CUDAQuantizer's adaptive block count (fewest blocks of < ~8000 elements that 8 x blocks
    divides); swizzled_quant's partition order, DeepSpeed's own example for 2 nodes of 4 ranks."""
    assert [weight_groups(n) for n in (1312, 8000, 24000, 8008)] == [1, 1, 3, 7]
    with pytest.raises(ValueError, match="multiple of 8"):
        weight_groups(1001)
    slots = swizzle_slots(8, 4)
    assert [p for _, p in sorted(zip(slots, range(8)))] == [0, 4, 1, 5, 2, 6, 3, 7]


def test_the_chapters_figures_are_measured_now(runs):
    """scripts/show_zeropp.py prints chapter 14d's tables from docs/zeropp-runs/zeropp.json:
    rank 0's bytes and calls per step, and the losses, equal what these ranks measure today
    (``python scripts/show_zeropp.py --measure`` rewrites it)."""
    import json
    from pathlib import Path
    committed = json.loads((Path(__file__).resolve().parent.parent / "docs/zeropp-runs/zeropp.json").read_text())
    records = runs[1][0]
    for case in CASES:
        assert committed[case]["steps"] == step_tallies(records, case), case
        assert committed[case]["losses"] == runs[0][0][case]["losses"], case


def test_the_keys_parse_as_deepspeeds_fields():
    """Each stage-3 key under its field name or its stage3_ alias (DeepSpeed's models take
    both), not both at once; zero_quantized_nontrainable_weights only at DeepSpeed's default,
    which is what minitron runs; a negative size refused (ge=0)."""
    from minitron.runtime.config_sections import DeepSpeedConfigError, parse_zero

    def parse(**zero):
        return parse_zero({"zero_optimization": {"stage": 3, **zero}}).stage3
    assert parse(stage3_prefetch_bucket_size=7).prefetch_bucket_size == parse(prefetch_bucket_size=7).prefetch_bucket_size == 7
    assert parse(stage3_gather_fp16_weights_on_model_save=True).gather_16bit_weights_on_model_save is True
    assert parse(zero_hpz_partition_size=2, zero_quantized_weights="true").zero_quantized_weights is True
    for zero, says in (({"stage3_max_reuse_distance": 1, "max_reuse_distance": 1}, "are one field"),
                       ({"zero_quantized_nontrainable_weights": True}, "DeepSpeed's default"),
                       ({"stage3_prefetch_bucket_size": -1}, "stage3_prefetch_bucket_size")):
        with pytest.raises(DeepSpeedConfigError, match=says):
            parse(**zero)


@pytest.mark.parametrize("zero, says", [({"zero_hpz_partition_size": 2}, "needs data parallelism over every rank"),
                                        ({"zero_quantized_gradients": True}, "needs data parallelism over every rank"),
                                        ({"zero_hpz_partition_size": 3}, "must divide the 4 ranks")])
def test_pretrain_refuses_groups_zeropp_cannot_cut(tmp_path, zero, says):
    """Before any rank starts: ZeRO++'s groups are cut from world ranks, so with tensor
    parallelism (dp 2 of 4) hpZ and qgZ are refused, and an hpZ size that does not divide dp."""
    import json

    from minitron.cli.common import UserError, validate_pretrain
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 1,
                                "zero_optimization": {"stage": 3, **zero}}))
    tp = ["--tensor-model-parallel-size", "2"] if "every rank" in says else []
    argv = [*tp, "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
            "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "1", "--lr", "1e-3",
            "--mock-data", "--vocab-size", "1023", "--deepspeed", "--deepspeed-config", str(path)]
    with pytest.raises(UserError, match=says):   # the CLI prints it as one line and exits 2
        validate_pretrain(argv, 4)
