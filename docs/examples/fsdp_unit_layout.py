"""Chapter 12: how Megatron-FSDP lays out one unit, printed from the layout minitron's units take.

    python docs/examples/fsdp_unit_layout.py

The model is tests/test_fsdp_estimate.py's (2 layers, hidden 32, ffn 71), over dp 2. Its
parameters come from the estimator's list (the shapes the model registers), and
core/distributed/fsdp/buffer_index.py lays them out, the function FSDPUnit lays itself out with
(tests/test_fsdp_layout.py holds a dp-2 wrapper's ranks to it; tests/test_fsdp_layout_mcore.py
holds it to Megatron-Core's own build_data_parallel_buffer_index). Torch-free: a fraction of a
second.
"""

from __future__ import annotations

from minitron.cli.common import validate_pretrain
from minitron.core.distributed.fsdp.buffer_index import build_buffer_index
from minitron.training.theoretical_fsdp import fsdp_units
from minitron.training.tokenizer import build_tokenizer

DP = 2
FLAGS = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--ffn-hidden-size", "71", "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "1",
         "--lr", "1e-3", "--mock-data", "--vocab-size", "1023", "--use-megatron-fsdp"]


def _owners(start: int, end: int, shard: int, row: int) -> str:
    """The rank(s) holding [start, end); for a parameter cut between two, the rows each holds."""
    first, last = start // shard, (end - 1) // shard
    if first == last:
        return str(first)
    cut = (last * shard - start) // row   # the first row past the boundary
    return f"{first} rows 0-{cut - 1}, {last} rows {cut}-{(end - start) // row - 1}"


def main() -> None:
    args = validate_pretrain(FLAGS, DP)
    build_tokenizer(args)
    unit = fsdp_units(args)[0]   # decoder.layers.0
    shapes = [(p.numel // p.row, p.row) if p.row > 1 else (p.numel,) for p in unit.params]
    index = build_buffer_index(shapes, DP)
    prefix = unit.name + "."
    widths = ", ".join(str(r) for r in sorted({p.row for p in unit.params}, reverse=True))
    print(f"{unit.name} over dp {DP}: rows {widths} elements wide; chunk {index.chunk} elements")
    print(f"  {'parameter':34} {'shape':>9} {'offset':>6} {'end':>6}  rank")
    for i in sorted(range(len(shapes)), key=lambda i: index.offsets[i]):
        start, end = index.offsets[i], index.offsets[i] + unit.params[i].numel
        print(f"  {unit.params[i].name.removeprefix(prefix):34} {str(shapes[i]):>9} {start:>6} {end:>6}"
              f"  {_owners(start, end, index.shard_size, unit.params[i].row)}")
    print(f"  {unit.numel:,} elements in a buffer of {index.size:,} ({index.size // index.chunk} chunks):"
          f" {index.size - unit.numel} of gaps and padding")
    print(f"  shards: rank 0 [0, {index.shard_size}), rank 1 [{index.shard_size}, {index.size})")
    # the same parameters end to end in registration order, padded to a multiple of dp only
    cut, start = -(-unit.numel // DP), 0
    for p in unit.params:
        if start < cut < start + p.numel:
            row, col = divmod(cut - start, p.row)
            print(f"end to end, the boundary ({cut:,}) would cut {p.name.removeprefix(prefix)}'s "
                  f"row {row} after column {col}")
        start += p.numel


if __name__ == "__main__":
    main()
