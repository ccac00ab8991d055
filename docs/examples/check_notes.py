"""Hold the group lists that written sources claim against what minitron's layout() computes.

    python docs/examples/check_notes.py megatron-16   # Megatron's docstring: 16 ranks, TP=2, PP=4
    python docs/examples/check_notes.py notes-8       # the source notes: 8 ranks, TP=2, PP=2, DP=2

The claims below are data copied from those sources (rank lists, nothing else); the other
column is computed now, by the same code initialize_model_parallel uses. The walkthrough's
chapter 6 runs this at build time, so the comparison can never go stale.
"""

from __future__ import annotations

import sys

from minitron.core.group_layout import layout, rank_coordinates

# name -> (world, tp, pp, {kind: claimed groups})
CLAIMS = {
    "megatron-16": (16, 2, 4, {
        "dp": [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]],
        "tp": [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]],
        "pp": [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]],
        # The notes add the model-parallel group (one whole model replica) for the same layout.
        "tp-pp": [[0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15]],
    }),
    "notes-8": (8, 2, 2, {
        "stages": [[0, 1, 2, 3], [4, 5, 6, 7]],      # step 1: split by pipeline stage
        "dp": [[0, 2], [1, 3], [4, 6], [5, 7]],      # step 2: data-parallel groups per stage
        "tp": [[0, 2], [1, 3], [4, 6], [5, 7]],      # step 3: "tensor-parallel" groups
    }),
}

TITLES = {"stages": "pipeline stages", "dp": "data-parallel", "tp": "tensor-parallel",
          "pp": "pipeline-parallel", "tp-pp": "model-parallel"}


def stages(world: int, tp: int, pp: int) -> list[list[int]]:
    """Not a group Megatron creates: the block of ranks that hold each pipeline stage."""
    blocks = [[] for _ in range(pp)]
    for rank in range(world):
        blocks[rank_coordinates(rank, world, tp=tp, pp=pp)["pp"]].append(rank)
    return blocks


def show(groups: list[list[int]]) -> str:
    return " ".join("[" + ",".join(map(str, g)) + "]" for g in groups)


def check(name: str) -> int:
    world, tp, pp, claims = CLAIMS[name]
    computed = layout(world, tp=tp, pp=pp)
    computed["stages"] = stages(world, tp, pp)
    print(f"{world} ranks, TP={tp}, PP={pp}, so DP={world // (tp * pp)}; rank order tp-cp-ep-dp-pp\n")
    wrong = 0
    for kind, claimed in claims.items():
        actual = computed[kind]
        verdict = "agrees" if claimed == actual else "DIFFERS"
        wrong += claimed != actual
        print(f"{TITLES[kind]} ({kind})")
        print(f"  claimed : {show(claimed)}")
        print(f"  computed: {show(actual)}   -> {verdict}")
        if claimed != actual:
            # Name what the claimed lists really are, if they are some other kind of group.
            same_as = [k for k in ("tp", "pp", "dp", "tp-pp", "embd") if computed[k] == claimed]
            if same_as:
                print(f"  the claimed lists are the computed {', '.join(same_as)} groups")
    print(f"\n{wrong} of {len(claims)} claims differ from the executed layout")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in CLAIMS:
        raise SystemExit(f"usage: check_notes.py {{{','.join(CLAIMS)}}}")
    sys.exit(check(sys.argv[1]))
