"""How a PipelineModule cuts its layer list into stages (``deepspeed/runtime/utils.py``:
partition_uniform, partition_balanced). Both return ``parts``, num_parts + 1 boundaries:
stage s builds layers ``parts[s]:parts[s + 1]``.

``partition_method`` picks the weights: "uniform" counts layers; "parameters" (the default)
weighs each layer by its trainable parameters, so a stage holding the embedding (vocab x hidden
weights) gets fewer transformer layers; "type:<regex>" weighs the layers whose class name matches
as 1 and the rest as 0, so "type:TransformerLayer" balances the transformer layers alone.
"""

from __future__ import annotations

INF = float("inf")


def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """Equal counts; the first ``num_items % num_parts`` parts get one more. Fewer items than
    parts: one item each, the rest empty."""
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    chunk, residual = divmod(num_items, num_parts)
    return [p * chunk + min(p, residual) for p in range(num_parts + 1)]


def partition_balanced(weights: list, num_parts: int) -> list[int]:
    """Contiguous parts whose weights are as even as possible, by dynamic programming over
    (first i items, j parts). DeepSpeed's measure of "even" is the spread, heaviest part minus
    lightest, not the heaviest alone; among equal spreads the last cut point tried wins."""
    n = len(weights)
    if n <= num_parts:
        return partition_uniform(n, num_parts)
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    # best[i][j] = (spread, heaviest, lightest) of the best split of items [0, i) into j parts
    best = [[(INF, INF, INF)] * (num_parts + 1) for _ in range(n + 1)]
    best[0][0] = (0.0, 0.0, INF)
    cut = [[0] * (num_parts + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        for j in range(1, min(i, num_parts) + 1):
            for k in range(i):   # the last part is items [k, i)
                last = prefix[i] - prefix[k]
                heaviest, lightest = max(best[k][j - 1][1], last), min(best[k][j - 1][2], last)
                if best[i][j][0] >= heaviest - lightest:
                    best[i][j] = (heaviest - lightest, heaviest, lightest)
                    cut[i][j] = k
    parts = [n]
    for j in range(num_parts, 0, -1):
        parts.append(cut[parts[-1]][j])
    return parts[::-1]
