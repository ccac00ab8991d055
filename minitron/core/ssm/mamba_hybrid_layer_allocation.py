"""Which layer is which in a hybrid model: Megatron's hybrid layer pattern, read one way.

``--hybrid-layer-pattern`` spells the stack one character per layer:

    M  a Mamba-2 layer (norm + MambaMixer)         *  an attention layer (norm + self-attention)
    -  an MLP layer (norm + MLP)                   E  an MoE layer (norm + mixture of experts)

so Nemotron-H's blocks read "M-M-M*-": a Mamba layer and an attention layer do what a
transformer layer's attention half does (mix along the sequence), and the MLP halves stand
as layers of their own. '|' cuts the pattern into pipeline stages ("M-M*|M-M-": two stages of
4 layers), which may be uneven; several segments per stage are the virtual pipeline's model
chunks. Megatron 0.19 also knows G (gated delta net), D (DeepSeek sparse attention), + (MLA)
and a "/"-separated multi-token-prediction tail; minitron builds none of those, and
``check_hybrid_pattern`` refuses them by name.

Torch-free: validate_args, the accountant and the FLOP count read it before any rank starts
(Megatron's megatron/core/models/hybrid/hybrid_layer_allocation.py, older home core/ssm/).
"""

from __future__ import annotations


class Symbols:
    MAMBA = "M"
    GDN = "G"
    ATTENTION = "*"
    DS_ATTENTION = "D"
    MLA = "+"
    MLP = "-"
    MOE = "E"
    PIPE = "|"
    MTP_SEPARATOR = "/"
    VALID_LAYERS = {MAMBA, GDN, ATTENTION, DS_ATTENTION, MLA, MLP, MOE}
    BUILT = {MAMBA: "Mamba", ATTENTION: "attention", MLP: "MLP", MOE: "MoE"}   # what minitron builds


def check_hybrid_pattern(pattern: str) -> str | None:
    """None if minitron can build ``pattern``, else one line saying why not."""
    if not pattern:
        return "--hybrid-layer-pattern is empty: give one symbol per layer, e.g. M-M*-"
    if Symbols.MTP_SEPARATOR in pattern:
        return ("--hybrid-layer-pattern has a '/' multi-token-prediction tail, which minitron does not build: "
                "drop it")
    for char in pattern:
        if char == Symbols.PIPE:
            continue
        if char not in Symbols.VALID_LAYERS:
            return (f"--hybrid-layer-pattern {pattern!r}: {char!r} is not a layer symbol "
                    "(M Mamba, * attention, - MLP, E MoE; | between pipeline stages)")
        if char not in Symbols.BUILT:
            return (f"--hybrid-layer-pattern {pattern!r}: {char!r} (Megatron's gated delta net, DSA or MLA "
                    "layer) is not built by minitron; use M, *, - and E")
    if any(not segment for segment in pattern.split(Symbols.PIPE)):
        return f"--hybrid-layer-pattern {pattern!r} has an empty pipeline segment (two '|' in a row, or one at an end)"
    return None


def get_hybrid_total_layer_count(pattern: str) -> int:
    """Layers in the pattern, separators not counted."""
    return len(pattern.replace(Symbols.PIPE, ""))


def get_hybrid_total_pipeline_segment_count(pattern: str) -> int:
    return pattern.count(Symbols.PIPE) + 1


def get_hybrid_layer_counts(pattern: str) -> dict[str, int]:
    """How many layers of each built kind: {'M': .., '*': .., '-': .., 'E': ..}."""
    return {symbol: pattern.count(symbol) for symbol in Symbols.BUILT}


def select_pipeline_segment(pattern: str, pp_rank: int, pp_size: int, vp_stage: int | None = None) -> tuple[str, int]:
    """(this stage's layer symbols, how many layers come before them), as Megatron selects them.

    With '|' separators the segments are dealt out round-robin: segment v * pp_size + r is
    model chunk v of pipeline rank r. Without them (Megatron's deprecated form) the pattern is
    cut into pp_size equal runs of layers.
    """
    segments = pattern.split(Symbols.PIPE)
    if len(segments) == 1:
        if len(pattern) % pp_size:
            raise ValueError(f"the {len(pattern)} layers of hybrid pattern {pattern!r} do not split evenly over "
                             f"{pp_size} pipeline stages: add '|' separators where the stages should end")
        per_stage = len(pattern) // pp_size
        return pattern[pp_rank * per_stage:(pp_rank + 1) * per_stage], pp_rank * per_stage
    if len(segments) % pp_size:
        raise ValueError(f"hybrid pattern {pattern!r} has {len(segments)} pipeline segments, not a multiple of "
                         f"--pipeline-model-parallel-size {pp_size}")
    index = (vp_stage or 0) * pp_size + pp_rank
    return segments[index], sum(len(s) for s in segments[:index])


def layer_symbols(pattern: str) -> str:
    """The whole stack's layers, in order, without separators (layer i+1 is symbol i)."""
    return pattern.replace(Symbols.PIPE, "")
