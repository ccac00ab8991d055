"""What each rank of another layout will read from a torch_dist checkpoint, predicted.

Nothing is built and nothing is loaded. Three facts suffice:

* the checkpoint's ``.metadata`` (DCP's): every key, its global shape, its stored chunks and
  the file and byte length of each;
* the args saved with it: the model's shape (layers, SwiGLU, tied embeddings, vocabulary);
* the sharding rules the modules use when they describe themselves
  (core/transformer/utils.py): a tensor-parallel weight is cut along its ``partition_dim``
  (fc1 of SwiGLU in two strided halves), everything else is whole on every tensor-parallel
  rank; a layer stack is one tensor whose first axis is the *global* layer number.

A rank of the target layout asks for its pieces; DCP reads every stored chunk a piece
overlaps, whole, and cuts the overlap out in memory (torch_dist.py, ``bytes_read``). So the
prediction is: the stored chunks that overlap any piece, each counted once, with its length.
The test holds this to what real loads at two layouts report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from minitron.core.pipeline_parallel.layer_layout import layer_counts
from minitron.core.pipeline_parallel.layer_layout import stage_layers as split_stage_layers
from minitron.training.tokenizer.tokenizer import _vocab_size_with_padding

# partition_dim of each tensor-parallel weight, by the layer that owns it: ColumnParallelLinear
# and VocabParallelEmbedding split their output rows (0), RowParallelLinear its input columns
# (1), and a row-parallel bias is added after the all-reduce, so it is whole on every rank.
PARTITION_DIM = {"word_embeddings.weight": 0, "output_layer.weight": 0,
                 "linear_qkv.weight": 0, "linear_qkv.bias": 0, "linear_fc1.weight": 0, "linear_fc1.bias": 0,
                 "linear_proj.weight": 1, "linear_fc2.weight": 1}
OPTIMIZER = re.compile(r"^optimizer\.state\.[^.]+\.")
EXPERTS = ".mlp.experts.experts."                          # one tensor, an axis of all experts
EARLIER_EXPERT = re.compile(r"\.experts\.local_experts\.(\d+)\.")   # an earlier minitron's: one per expert
LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")


@dataclass(frozen=True)
class Target:
    tp: int
    pp: int
    dp: int
    vp: int | None = None
    ep: int = 1
    # An uneven split of the target's layers, as pretrain takes it (Megatron-Core's flags)
    first: int | None = None                  # --decoder-first-pipeline-num-layers
    last: int | None = None                   # --decoder-last-pipeline-num-layers
    layout: str | None = None                 # --pipeline-model-parallel-layout (sets vp)
    embedding: bool = False                   # --account-for-embedding-in-pipeline-split
    loss: bool = False                        # --account-for-loss-in-pipeline-split

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def coordinates(self, rank: int) -> tuple[int, int, int]:
        """(tp, pp, dp) of a global rank in Megatron's default order: tp fastest, then dp, then pp."""
        return rank % self.tp, rank // (self.tp * self.dp), rank // self.tp % self.dp

    def split_flags(self) -> list[str]:
        """The split as pretrain's flags, so that the target is validated as a run would be."""
        flags = [("--decoder-first-pipeline-num-layers", self.first), ("--decoder-last-pipeline-num-layers",
                 self.last), ("--pipeline-model-parallel-layout", self.layout)]
        return [str(part) for flag, value in flags if value is not None for part in (flag, value)] + \
            ["--account-for-embedding-in-pipeline-split"] * self.embedding + \
            ["--account-for-loss-in-pipeline-split"] * self.loss

    def expert_rank(self, rank: int) -> int:
        """The expert-parallel rank: ep folds into the data-parallel ranks (tp, ep, dp/ep, pp)."""
        return rank // self.tp % self.ep


def stage_layers(num_layers: int, target: Target, pp_rank: int) -> list[tuple[int, int]]:
    """[first, end) of each model chunk's layers on this stage, by the split the model builds
    (core/pipeline_parallel/layer_layout.py: even, first/last stage sizes, or a layout)."""
    counts = layer_counts(num_layers, target.pp, target.vp, first=target.first, last=target.last,
                          embedding=target.embedding, loss=target.loss, layout=target.layout)
    chunks = len(counts) // target.pp          # a layout sets the chunks per rank
    return [(r.start, r.stop) for r in (split_stage_layers(counts, target.pp, pp_rank, c) for c in range(chunks))]


def _tp_ranges(size: int, stride: int, tp_rank: int, tp: int) -> list[tuple[int, int]]:
    """This tp rank's ranges of an axis of ``size``: piece r of tp, in each of ``stride`` blocks."""
    block = size // stride
    return [(j * block + tp_rank * block // tp, j * block + (tp_rank + 1) * block // tp) for j in range(stride)]


def wanted_pieces(key: str, shape: tuple[int, ...], args: dict, target: Target,
                  rank: int) -> list[list[tuple[int, int]]]:
    """The pieces (one [start, end) per axis) of ``key`` that ``rank`` asks for; [] for none."""
    name = OPTIMIZER.sub("", key)             # a moment is cut exactly as its parameter
    tp_rank, pp_rank, _ = target.coordinates(rank)
    first, last = pp_rank == 0, pp_rank == target.pp - 1
    axes: list[list[tuple[int, int]]] = [[(0, n)] for n in shape]
    stacked = name.startswith("decoder.layers.") and not LAYER.match(name)
    if name.startswith("decoder.layers."):
        layers = stage_layers(args["num_layers"], target, pp_rank)
        if stacked:
            axes[0] = layers
        elif not any(a <= int(LAYER.match(name)[1]) < b for a, b in layers):
            return []
    elif name.startswith("embedding."):
        tied_copy = name == "embedding.word_embeddings.weight" and last and \
            not args.get("untie_embeddings_and_output_weights")
        if not (first or tied_copy):
            return []
    elif not last:                             # output_layer, decoder.final_layernorm
        return []
    # Experts: an ep rank holds experts [j*E_local, (j+1)*E_local), on the axis after the layer
    # axis (Megatron's), or, in an earlier minitron's checkpoint, by the index in the key; each
    # is cut by tp (the default --expert-tensor-parallel-size).
    expert_axis, earlier = (int(stacked) if EXPERTS in name else None), EARLIER_EXPERT.search(name)
    if expert_axis is not None or earlier:
        per_rank, ep_rank = args["num_experts"] // target.ep, target.expert_rank(rank)
        if expert_axis is not None:
            axes[expert_axis] = [(ep_rank * per_rank, (ep_rank + 1) * per_rank)]
        elif int(earlier[1]) // per_rank != ep_rank:
            return []
    suffix = ".".join(name.split(".")[-2:])
    if suffix in PARTITION_DIM:
        axis = PARTITION_DIM[suffix] + int(stacked) + int(expert_axis is not None)
        size = shape[axis]
        if suffix in ("word_embeddings.weight", "output_layer.weight"):
            size = padded_vocab(args, target.tp)   # the target pads its vocabulary for its own tp
        stride = 2 if suffix.startswith("linear_fc1") and args.get("swiglu") else 1
        axes[axis] = _tp_ranges(size, stride, tp_rank, target.tp)
    pieces = [[]]
    for ranges in axes:
        pieces = [p + [r] for p in pieces for r in ranges]
    # Rows past the stored vocabulary are left zero (allow_shape_mismatch): nothing to read there.
    return [[(a, min(b, n)) for (a, b), n in zip(p, shape)] for p in pieces
            if all(a < min(b, n) for (a, b), n in zip(p, shape))]


def padded_vocab(args: dict, tp: int) -> int:
    """The vocabulary the target pads for its own tp (the tokenizer's rule)."""
    vocab = args.get("vocab_size") or args["padded_vocab_size"]   # a file tokenizer's size is not saved
    return _vocab_size_with_padding(vocab, args.get("make_vocab_size_divisible_by", 128), tp)


def _overlaps(piece, offsets, sizes) -> bool:
    return all(a < o + s and o < b for (a, b), o, s in zip(piece, offsets, sizes))


def plan_reads(dcp_meta, args: dict, target: Target, saved_grid: tuple[int, int, int]) -> list[dict]:
    """Per target rank: {"rank", "files": {file: bytes}, "keys": {key: [(offset, file, bytes)]}}.

    ``saved_grid``: (pp, tp, dp) of the writing layout; its RNG cells are read only by the same grid."""
    stored: dict[str, list] = {}
    for index, info in dcp_meta.storage_data.items():
        stored.setdefault(index.fqn, []).append((tuple(index.offset or ()), info.relative_path, info.length))
    out = []
    for rank in range(target.world):
        keys: dict[str, list] = {}
        for key, md in dcp_meta.state_dict_metadata.items():
            if key.startswith("rng_state/"):
                tp_rank, pp_rank, dp_rank = target.coordinates(rank)
                grid = (target.pp, target.tp, target.dp)
                if grid == saved_grid and key == f"rng_state/shard_{pp_rank}.{tp_rank}.{dp_rank}_" \
                        f"{'.'.join(map(str, grid))}":
                    keys[key] = stored[key]
                continue
            pieces = wanted_pieces(key, tuple(md.size), args, target, rank)
            sizes = {tuple(c.offsets): tuple(c.sizes) for c in md.chunks}
            hit = [(o, f, n) for o, f, n in stored.get(key, [])
                   if any(_overlaps(p, o, sizes[o]) for p in pieces)]
            if hit:
                keys[key] = hit
        files: dict[str, int] = {}
        for chunks in keys.values():
            for _, f, n in chunks:
                files[f] = files.get(f, 0) + n
        out.append({"rank": rank, "files": dict(sorted(files.items())), "keys": keys})
    return out
