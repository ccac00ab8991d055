"""test_ds_activation_checkpointing.py's checkpoint held against the real DeepSpeed 0.19.8's, on
its CPU accelerator, in the same forked gloo ranks (2, one tensor-parallel group): the same
2-layer GPT with full recomputation runs its chunks once through ``deepspeed.checkpointing.
checkpoint`` and once through minitron's, partition_activations off and on.

Held bit for bit (same arithmetic in the same order, same draws replayed): the loss, every
gradient, and what each keeps per chunk for the backward (the very partition tensors). And one
difference, on purpose: DeepSpeed empties a partitioned input in place, minitron does not. The
hidden dropout is on; the attention dropout is off, because it draws from minitron's
model-parallel stream, which DeepSpeed's checkpoint does not know (Megatron-DeepSpeed swaps
Megatron's tracker for DeepSpeed's for that reason; minitron's checkpoint shares minitron's).
"""
import os

import torch

from deepspeed_child import NEEDS_DEEPSPEED
from distributed import run_ranks

pytestmark = NEEDS_DEEPSPEED
os.environ.setdefault("DS_ACCELERATOR", "cpu")   # the forked ranks inherit it

VOCAB, SEQ, BATCH = 64, 32, 2


def _run(use_deepspeed: bool, partition: bool) -> dict:
    import deepspeed
    from deepspeed.runtime.activation_checkpointing import checkpointing as theirs

    from minitron.core import parallel_state
    from minitron.core.models.gpt import GPTModel
    from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from minitron.core.tensor_parallel.random import replace_checkpoint
    from minitron.core.transformer import TransformerConfig
    from minitron.runtime.activation_checkpointing import checkpointing as ours

    kept = []
    record, keep = theirs.partition_activations, ours._keep
    if use_deepspeed:
        theirs.configure(parallel_state, partition_activations=partition)

        def recorded(args, *rest):   # what DeepSpeed keeps in place of each input
            out = record(args, *rest)
            kept.append([t.clone() if torch.is_tensor(t) else None for t in out])
            return out
        theirs.partition_activations = recorded

        def by_position(function, *args):
            # With partition_activations, DeepSpeed 0.19.8 hands the recompute each None input
            # twice (it pairs every input with its size, None for None, and unpairs only the
            # tensors), so the replay gets trailing extra Nones; Megatron-DeepSpeed's chunk
            # functions read their inputs by position and never see them. So does this one.
            return theirs.checkpoint(lambda *given: function(*given[:len(args)]), *args)

        replace_checkpoint(by_position)   # Megatron-DeepSpeed's swap, to DeepSpeed's own checkpoint
    else:
        ours.configure(parallel_state, partition_activations=partition)

        def recorded_keep(item, position):
            out = keep(item, position)
            if position == 0:
                kept.append([])
            kept[-1].append(out.clone() if torch.is_tensor(out) else None)
            return out
        ours._keep = recorded_keep
    try:
        config = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=128,
                                   tensor_model_parallel_size=2, hidden_dropout=0.1, attention_dropout=0.0,
                                   init_seed=5, recompute_granularity="full", recompute_method="uniform",
                                   recompute_num_layers=1)
        model_parallel_cuda_manual_seed(11)
        model = GPTModel(config, VOCAB, SEQ)
        g = torch.Generator().manual_seed(7)
        ids, labels = (torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(2))
        loss = model(ids, torch.arange(SEQ).expand(BATCH, SEQ), labels=labels).mean()
        loss.backward()
    finally:
        ours._keep, theirs.partition_activations = keep, record
        ours.unconfigure()
    return {"loss": loss.detach(), "grads": {n: p.grad for n, p in model.named_parameters()}, "kept": kept}


def _both(rank):
    import deepspeed

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")   # adopts the world the ranks already joined
    from minitron import comm
    comm.init_distributed(dist_backend="gloo")         # and minitron's, which its checkpoint gathers through
    out = {}
    for partition in (False, True):
        theirs, ours = _run(True, partition), _run(False, partition)
        out[partition] = {
            "loss": torch.equal(theirs["loss"], ours["loss"]),
            "grads": all(torch.equal(theirs["grads"][n], ours["grads"][n]) for n in ours["grads"]),
            # per chunk: only the floating hidden states are kept as a tensor (the mask and the
            # rotary table are None here); DeepSpeed returns inputs as given when it does not partition
            "kept": [[None if t is None else list(t.shape) for t in chunk] for chunk in ours["kept"]],
            "same_kept": len(theirs["kept"]) == len(ours["kept"]) and all(
                all((a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
                    for a, b in zip(x, y)) for x, y in zip(theirs["kept"], ours["kept"])) if partition else True,
        }
    # What minitron does not copy: DeepSpeed empties each input it partitioned, in place, so a
    # tensor handed to two checkpoints (a rotary table, say) reaches the second as a 0-d tensor
    # of whatever memory it got, and broadcasting hides it. minitron's leaves the input whole.
    from deepspeed.runtime.activation_checkpointing import checkpointing as theirs
    from minitron.core import parallel_state
    from minitron.runtime.activation_checkpointing import checkpointing as ours

    shapes = {}
    for who, module in (("deepspeed", theirs), ("minitron", ours)):
        module.configure(parallel_state, partition_activations=True)
        h, table = torch.ones(4, 8, requires_grad=True), torch.ones(4, 8)
        module.checkpoint(lambda a, b: a * b, h, table)
        shapes[who] = list(table.shape)
    ours.unconfigure()
    out["shared input after one checkpoint"] = shapes
    return out


def test_deepspeed_checkpoint_keeps_and_computes_the_same():
    results = run_ranks(_both, world_size=2, tp=2)
    for rank in results:
        assert rank.pop("shared input after one checkpoint") == {"deepspeed": [], "minitron": [4, 8]}
        for partition, row in rank.items():
            assert row["loss"] and row["grads"], (partition, row)
            assert row["same_kept"], partition
        # partitioned: each rank keeps 32 x 2 x 32 / 2 = 1024 numbers of each chunk's input
        assert rank[True]["kept"] == [[[1024], None, None]] * 2
