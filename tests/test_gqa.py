"""Grouped-query attention with fewer key/value groups than tensor-parallel ranks.

8 query heads in 2 groups on 4 tensor-parallel ranks: two ranks share each group's key and
value, and each takes 2 of its 4 query heads. Every rank's weights must be exactly its slice of the serial model's
(Megatron's layout, the plain column split), the loss the serial loss, and every gradient its
slice of the serial gradient: the key/value weights' gradients only come out right if the
all-gather's backward sums the shares of the ranks that read them. Rope, per-head norms and
sequence parallelism ride along, since each touches the heads a rank keeps.
"""

from __future__ import annotations

import torch

from distributed import rope_gpt_loss_backward, run_ranks, tp_shard
from minitron.core import parallel_state
from minitron.core.transformer import TransformerConfig

VOCAB, SEQ, BATCH, TOL = 64, 8, 2, 1e-5
CASES = {"2 groups, sp": dict(num_query_groups=2, sequence_parallel=True)}   # one case: 4 ranks cost ~1.5 s


def _runs(tp: int):
    def body(rank):
        torch.set_num_threads(1)
        out = {}
        for name, fields in CASES.items():
            config = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=8, ffn_hidden_size=32,
                                       hidden_dropout=0.0, attention_dropout=0.0, init_seed=3, qk_layernorm=True,
                                       tensor_model_parallel_size=tp, **fields)
            model, loss = rope_gpt_loss_backward(config, VOCAB, SEQ, BATCH)
            for n, p in model.named_parameters():   # finalize_model_grads' sums (partial over TP)
                if tp > 1 and ("layernorm" in n and ("q_" in n or "k_" in n) or getattr(p, "sequence_parallel", 0)):
                    torch.distributed.all_reduce(p.grad, group=parallel_state.get_tensor_model_parallel_group())
            out[name] = {"loss": loss.detach(), "params": dict(model.named_parameters()),
                         "weights": {n: p.detach() for n, p in model.named_parameters()},
                         "grads": {n: p.grad for n, p in model.named_parameters()}}
        if tp == 1:
            return out
        r = parallel_state.get_tensor_model_parallel_rank()
        serial = _runs.serial
        return {name: {"loss": (o["loss"] - serial[name]["loss"]).abs().max().item(),
                       "exact": all(torch.equal(w, tp_shard(serial[name]["weights"][n], o["params"][n], r, tp))
                                    for n, w in o["weights"].items()),
                       "grad": max((g - tp_shard(serial[name]["grads"][n], o["params"][n], r, tp)).abs().max().item()
                                   for n, g in o["grads"].items())}
                for name, o in out.items()}
    return run_ranks(body, world_size=tp, tp=tp)


def test_fewer_query_groups_than_tp_ranks_equals_serial():
    serial = _runs(1)[0]
    _runs.serial = {name: {k: v for k, v in o.items() if k != "params"} for name, o in serial.items()}
    results = _runs(4)   # the forked ranks inherit _runs.serial
    for name in CASES:
        assert all(r[name]["exact"] for r in results), f"{name}: weights are not the serial weights' slices"
        loss, grad = max(r[name]["loss"] for r in results), max(r[name]["grad"] for r in results)
        assert loss < TOL and grad < TOL, f"{name}: loss off by {loss:.1e}, a gradient by {grad:.1e}"
