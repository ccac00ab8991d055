"""ZeRO-R's activation bytes per rank: chapter 14e runs this.

    python docs/examples/zero_r_bytes.py          # the table
    python docs/examples/zero_r_bytes.py --json   # every number, for tests/test_ds_activation_checkpointing.py
    python docs/examples/zero_r_bytes.py --gathers TRACE_DIR   # a traced run's gathers, rank by rank

A 2-layer GPT (hidden 32, sequence 32, micro-batch 2, dropout 0.1 everywhere) with full
recomputation, one layer per checkpoint, on 2 forked gloo ranks that form one tensor-parallel
group. For each setting of the ds_config's activation_checkpointing section, every rank runs the
same forward and backward and reports:

    kept      the bytes the checkpoints hold from forward to backward, counted by torch's
              saved-tensor hooks while the checkpointed layers run (inside a checkpoint the layers
              run without autograd, so what is saved there is exactly what the checkpoint keeps),
              split by the device they live on
    saved     everything the forward saved for backward on this rank (embedding, output layer
              and loss included), parameters left out
    gathers   how many all_gather_into_tensor calls the backward made to rebuild partitions
    loss, and whether every gradient is bit-equal to Megatron's checkpoint's.
"""

from __future__ import annotations

import json
import sys

import torch

from minitron import comm
from minitron.core import parallel_state
from minitron.core.models.gpt import GPTModel
from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
from minitron.core.transformer import TransformerConfig
from minitron.core.transformer.transformer_block import TransformerBlock
from minitron.launcher import LaunchConfig, run_on_ranks, session_env
from minitron.runtime.activation_checkpointing import checkpointing

TP, VOCAB, SEQ, BATCH = 2, 64, 32, 2
CASES = {   # the ds_config's activation_checkpointing section; None: Megatron's own checkpoint
    "Megatron's checkpoint": None,
    "DeepSpeed's, defaults": {},
    "partition_activations": {"partition_activations": True},
    "cpu_checkpointing": {"cpu_checkpointing": True},
    "partition + cpu": {"partition_activations": True, "cpu_checkpointing": True},
    "partition + contiguous": {"partition_activations": True, "contiguous_memory_optimization": True,
                               "number_checkpoints": 2},
}


SECTION = "activation_checkpointing"


def _one_case(section) -> dict:
    if section is None:
        checkpointing.unconfigure()   # not configured: Megatron's checkpoint
    else:
        checkpointing.configure(parallel_state, deepspeed_config={SECTION: section})
    config = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=128,
                               tensor_model_parallel_size=TP, hidden_dropout=0.1, attention_dropout=0.1,
                               init_seed=5, recompute_granularity="full", recompute_method="uniform",
                               recompute_num_layers=1)
    model_parallel_cuda_manual_seed(11)
    model = GPTModel(config, VOCAB, SEQ)
    g = torch.Generator().manual_seed(7)
    ids, labels = (torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(2))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, tuple[bool, str, int]] = {}   # storage -> (kept by a checkpoint, device, bytes)
    inside = [False]

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = (inside[0], tensor.device.type, storage.nbytes())
        return tensor

    def checkpointed(*args):   # the block's checkpointed forward, marked as such
        inside[0] = True
        try:
            return TransformerBlock._checkpointed_forward(model.decoder, *args)
        finally:
            inside[0] = False
    model.decoder._checkpointed_forward = checkpointed
    gathers = []
    original = torch.distributed.all_gather_into_tensor
    torch.distributed.all_gather_into_tensor = lambda *a, **k: gathers.append(1) or original(*a, **k)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = model(ids, torch.arange(SEQ).expand(BATCH, SEQ), labels=labels).mean()
        loss.backward()
    finally:
        torch.distributed.all_gather_into_tensor = original
    kept: dict[str, int] = {}
    for by_checkpoint, device, nbytes in saved.values():
        if by_checkpoint:
            kept[device] = kept.get(device, 0) + nbytes
    return {"kept": kept, "saved": sum(nbytes for *_, nbytes in saved.values()), "gathers": len(gathers),
            "loss": loss.item(), "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}


def measure(rank: int) -> dict:
    """Every case on this rank; gradients compared here, against Megatron's checkpoint's."""
    torch.set_num_threads(1)
    comm.init_distributed()   # DeepSpeed's checkpoint gathers through it, as through deepspeed.comm
    parallel_state.initialize_model_parallel(TP)
    try:
        results = {name: _one_case(section) for name, section in CASES.items()}
    finally:
        checkpointing.unconfigure()
        parallel_state.destroy_model_parallel()
    reference = results["Megatron's checkpoint"]["grads"]
    for result in results.values():
        grads = result.pop("grads")
        result["same_grads"] = all(torch.equal(grads[n], reference[n]) for n in reference)
    return results


def run() -> list[dict]:
    return run_on_ranks(measure, LaunchConfig(world_size=TP, env=session_env(TP, None)))


def table(results: list[dict]) -> str:
    lines = [f"{'activation_checkpointing':<24}{'kept (bytes)':>14}{'where':>6}{'saved':>8}{'gathers':>9}"
             f"{'loss':>9}  grads", "-" * 78]
    for name, row in results[0].items():   # rank 0; rank 1 holds the same numbers (test-checked)
        where = "+".join(sorted(row["kept"]))
        lines.append(f"{name:<24}{sum(row['kept'].values()):>14,}{where:>6}{row['saved']:>8,}{row['gathers']:>9}"
                     f"{row['loss']:>9.5f}  {'same' if row['same_grads'] else 'DIFFER'}")
    return "\n".join(lines)


def gathers(trace_dir: str) -> str:
    """Each rank's first gather of a partitioned checkpoint in a traced run: what it rebuilt, and
    the collective underneath (the shape each rank sent, the group)."""
    from minitron.trace.reader import load_trace

    lines = []
    for rank, calls in sorted(load_trace(trace_dir).items()):
        mine = [c for c in calls if c["name"].endswith("gather_partitioned_activations")]
        first = mine[0]
        # one minitron.comm call per floating input, torch's collective inside each (it has the args)
        comm_calls = [c["id"] for c in calls if c.get("parent") == first["id"]]
        under = [c for c in calls if c.get("parent") in comm_calls]
        assert all(c["args"] == first["args"] for c in mine), "the checkpoints' inputs differ in shape"
        lines.append(f"rank {rank}: {len(mine)} gathers in backward, one per checkpoint")
        for shape, call in zip(first["args"]["shapes"], under):
            a = call["args"]
            lines += [f"  each rebuilds {shape} from {a['shape']} {a['dtype']} per rank:",
                      f"  {call['name'].rsplit('.', 1)[-1]} over {a['group']} {a['ranks']}"]
    return "\n".join(lines)


if __name__ == "__main__":
    if "--gathers" in sys.argv:
        print(gathers(sys.argv[sys.argv.index("--gathers") + 1]))
    else:
        answer = run()
        print(json.dumps(answer, indent=1) if "--json" in sys.argv else table(answer))
