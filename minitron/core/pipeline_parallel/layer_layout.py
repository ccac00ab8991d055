"""Which transformer layers each pipeline stage (and model chunk) builds.

Megatron-Core spreads this over get_num_layers_to_build (transformer_block.py),
get_transformer_layer_offset (transformer_layer.py) and PipelineParallelLayerLayout (its own
file); here one torch-free file holds it, because the model, the memory estimate and the
`trace --backend fake` view must agree on it, and the estimate and validate_args may not import
torch. It lives in this package, whose __init__ imports nothing (minitron.core.transformer's
imports torch); minitron/core/transformer/pipeline_parallel_layer_layout.py, Megatron's room for
it, re-exports it for the model's side.

Every way of splitting reduces to one list: the number of layers of each *virtual stage*, in
the order a micro-batch visits them. With p ranks and v chunks per rank, virtual stage
i = c·p + r is chunk c of rank r. A stage's first layer number is the sum of the counts before
it, so layer numbers (and the checkpoint keys made from them) stay global whatever the split.
The four ways, as Megatron 0.19.2 offers them (at most one of them at a time):

* even (default): L / (p·v) layers everywhere;
* ``--decoder-first-pipeline-num-layers F`` / ``--decoder-last-pipeline-num-layers K``: the first
  (last) rank takes F (K) layers, F / v per chunk; the other ranks share the rest evenly;
* ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``: the
  embedding (the loss) counts as one more layer in an even split, so the first (last) virtual
  stage builds one transformer layer fewer;
* ``--pipeline-model-parallel-layout``: the stages written out, e.g. ``"Et*3|t*3L"``: E the
  embedding, t a transformer layer, m an MTP layer, L the loss, ``|`` between virtual stages
  (p·v of them, so the layout sets v), ``x*n`` and ``(...)*n`` repeat, commas are cosmetic.
"""

from __future__ import annotations

import re

_SYMBOLS = {"E": "embedding", "t": "decoder", "m": "mtp", "L": "loss"}


def parse_layout(layout: str) -> list[list[str]]:
    """The layout string as a list of virtual stages, each a list of "E", "t", "m", "L";
    ValueError (one line) for a character Megatron does not know."""
    text = layout.replace(",", "")
    # Repetitions unroll innermost-first as Megatron reads them: "(ab|)*2" then "x*3".
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    stages = [list(stage) for stage in text.split("|")]
    for stage in stages:
        for char in stage:
            if char not in _SYMBOLS:
                raise ValueError(f"--pipeline-model-parallel-layout {layout!r}: unknown layer {char!r}; "
                                 f"known: E (embedding), t (transformer layer), m (MTP layer), L (loss), | (stage)")
    return stages


def layout_problem(layout: str, pp: int, num_layers: int, mtp_num_layers: int | None) -> str | None:
    """Why minitron cannot build this layout (one line), or None. Megatron's rules (stages a
    multiple of p; E first, L last, each once; as many t as --num-layers; as many m as
    --mtp-num-layers, after every t), plus minitron's own: its MTP block sits with the loss."""
    flag = f"--pipeline-model-parallel-layout {layout!r}"
    try:
        stages = parse_layout(layout)
    except ValueError as exc:
        return str(exc)
    flat = [s for stage in stages for s in stage]
    if len(stages) % pp:
        return f"{flag} has {len(stages)} stages, not a multiple of --pipeline-model-parallel-size {pp}"
    if flat[:1] != ["E"] or flat.count("E") != 1:
        return f"{flag}: the embedding E must come once, first"
    if flat[-1:] != ["L"] or flat.count("L") != 1:
        return f"{flag}: the loss L must come once, last"
    if flat.count("t") != num_layers:
        return f"{flag} places {flat.count('t')} transformer layers t, but --num-layers is {num_layers}"
    if flat.count("m") != (mtp_num_layers or 0):
        return (f"{flag} places {flat.count('m')} MTP layers m, but --mtp-num-layers is {mtp_num_layers or 0}"
                + ("" if mtp_num_layers else " (minitron builds MTP layers only with --mtp-num-layers)"))
    if "m" in flat and (set(flat[flat.index("m"):]) - {"m", "L"} or "m" not in stages[-1]):
        return f"{flag}: minitron builds the MTP layers m after every t, in the last stage, beside the loss L"
    return None


def layer_counts(num_layers: int, pp: int, vp: int | None = None, *, first: int | None = None,
                 last: int | None = None, embedding: bool = False, loss: bool = False,
                 layout: str | None = None) -> list[int]:
    """Transformer layers of each virtual stage, i = chunk · p + rank (see the module's note).
    Assumes the split passed split_problem (validate_args checks it before any rank starts)."""
    if layout is not None:
        return [stage.count("t") for stage in parse_layout(layout)]
    v = vp or 1
    if first is not None or last is not None:
        middle_ranks = pp - (first is not None) - (last is not None)
        middle = (num_layers - (first or 0) - (last or 0)) // middle_ranks // v if middle_ranks else 0
        per_rank = [middle] * pp
        if first is not None:
            per_rank[0] = first // v
        if last is not None:
            per_rank[-1] = last // v
        return per_rank * v
    per_stage = (num_layers + embedding + loss) // (pp * v)
    counts = [per_stage] * (pp * v)
    counts[0] -= embedding      # the embedding stands in for a layer on the very first stage,
    counts[-1] -= loss          # the loss for one on the very last
    return counts


def split_problem(num_layers: int, pp: int, vp: int | None = None, *, first: int | None = None,
                  last: int | None = None, embedding: bool = False, loss: bool = False) -> str | None:
    """Why these flags cannot split --num-layers over the pipeline (one line), or None:
    Megatron-Core 0.19.2's conditions (its TransformerConfig checks), under minitron's flag names."""
    v = vp or 1
    if (first is not None or last is not None) and (embedding or loss):
        return ("--decoder-first/last-pipeline-num-layers exclude --account-for-embedding/loss-in-pipeline-split: "
                "give one kind of uneven split")
    if first is not None or last is not None:
        if pp == 1:
            return "--decoder-first/last-pipeline-num-layers need --pipeline-model-parallel-size > 1"
        middle_layers, middle_ranks = num_layers, pp
        for flag, n in (("--decoder-first-pipeline-num-layers", first), ("--decoder-last-pipeline-num-layers", last)):
            if n is None:
                continue
            if n <= 0 or n % v:
                return f"{flag} {n} must be positive" + (f" and divisible by the {v} model chunks per rank" if v > 1 else "")
            middle_layers, middle_ranks = middle_layers - n, middle_ranks - 1
        if middle_layers < 0 or bool(middle_layers) != bool(middle_ranks):
            return (f"--num-layers {num_layers} leaves {middle_layers} layers for the {middle_ranks} pipeline ranks "
                    f"between the first and the last")
        if middle_ranks and middle_layers % (middle_ranks * v):
            return (f"the {middle_layers} layers left for the {middle_ranks} middle pipeline ranks do not split "
                    f"evenly" + (f" into {v} model chunks each" if v > 1 else ""))
        return None
    total = num_layers + embedding + loss
    counted = " (counting the embedding and/or loss as layers)" if embedding or loss else ""
    if total % (pp * v):
        return (f"--num-layers {num_layers}{counted} = {total} does not split into --pipeline-model-parallel-size "
                f"{pp}" + (f" x {v} model chunks" if v > 1 else ""))
    if (embedding or loss) and min(layer_counts(num_layers, pp, vp, embedding=embedding, loss=loss)) < 0:
        return f"--num-layers {num_layers}{counted}: the first or last stage has no layer to give up"
    return None


def stage_layers(counts: list[int], pp: int, pp_rank: int, vp_stage: int | None = None) -> range:
    """0-based global layer indices of chunk ``vp_stage`` on rank ``pp_rank``."""
    i = (vp_stage or 0) * pp + pp_rank
    start = sum(counts[:i])
    return range(start, start + counts[i])


def counts_from(obj) -> list[int]:
    """layer_counts for validated args (Megatron's flag names) or a TransformerConfig
    (Megatron's field names): the same split whichever the caller holds."""
    def get(*names):
        return next((getattr(obj, n) for n in names if getattr(obj, n, None) is not None), None)
    return layer_counts(obj.num_layers, obj.pipeline_model_parallel_size, obj.virtual_pipeline_model_parallel_size,
                        first=get("decoder_first_pipeline_num_layers", "num_layers_in_first_pipeline_stage"),
                        last=get("decoder_last_pipeline_num_layers", "num_layers_in_last_pipeline_stage"),
                        embedding=bool(get("account_for_embedding_in_pipeline_split")),
                        loss=bool(get("account_for_loss_in_pipeline_split")),
                        layout=get("pipeline_model_parallel_layout"))


def config_split_problem(config) -> str | None:
    """split_problem / layout_problem for a TransformerConfig (Megatron checks in its __post_init__)."""
    if config.pipeline_model_parallel_layout is not None:
        return layout_problem(config.pipeline_model_parallel_layout, config.pipeline_model_parallel_size,
                              config.num_layers, getattr(config, "mtp_num_layers", None))
    return split_problem(config.num_layers, config.pipeline_model_parallel_size,
                         config.virtual_pipeline_model_parallel_size,
                         first=config.num_layers_in_first_pipeline_stage, last=config.num_layers_in_last_pipeline_stage,
                         embedding=config.account_for_embedding_in_pipeline_split,
                         loss=config.account_for_loss_in_pipeline_split)
