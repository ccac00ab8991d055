"""Print the real data-path arrays of a tiny corpus, for the data chapter (each view < 5 s).

    python scripts/show_data_indices.py layout      the .idx, field by field
    python scripts/show_data_indices.py indices     document / sample / shuffle index
    python scripts/show_data_indices.py sample [I]  how sample I (default: the first that spans
                                                    two documents) is cut from the documents
    python scripts/show_data_indices.py samplers    which samples each dp rank reads, and resuming
    python scripts/show_data_indices.py token       one token, from iteration and rank back to the .bin
    python scripts/show_data_indices.py barrier     4 gloo ranks build the dataset: who builds, who waits

The corpus is the first line of eight standard-library modules' docstrings, byte-level
tokenized with an end-of-document token: small enough to print whole.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import tempfile


MODULES = ["csv", "heapq", "bisect", "textwrap", "shlex", "fnmatch", "glob", "string"]
SEQ, NUM_SAMPLES, SEED = 16, 30, 1234
EOD = 256


def build_corpus(work: str) -> str:
    import importlib
    from minitron.tools.preprocess_data import run_preprocess
    src = os.path.join(work, "tiny.jsonl")
    with open(src, "w") as f:
        for name in MODULES:
            first_line = importlib.import_module(name).__doc__.strip().splitlines()[0]
            f.write(json.dumps({"text": first_line}) + "\n")
    return run_preprocess(src, os.path.join(work, "tiny"), "ByteLevelTokenizer", append_eod=True,
                          progress=False).output_prefixes["text"]


def show(ids) -> str:
    """Byte-level ids as text; the end-of-document id as ¶."""
    return "".join("¶" if int(i) == EOD else chr(int(i)) for i in ids)


def dataset(work: str):
    from minitron.core.datasets import BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig
    from minitron.training.tokenizer import ByteLevelTokenizer
    cfg = GPTDatasetConfig(random_seed=SEED, sequence_length=SEQ, blend=([build_corpus(work)], None),
                           split="100,0,0", path_to_cache=os.path.join(work, "cache"),
                           tokenizer=ByteLevelTokenizer())
    return BlendedMegatronDatasetBuilder(GPTDataset, [NUM_SAMPLES, 0, 0], lambda: True, cfg).build()[0]


def cmd_layout(work: str) -> None:
    from minitron.core.datasets import IndexedDataset
    prefix = build_corpus(work)
    raw = open(prefix + ".idx", "rb").read()
    ds = IndexedDataset(prefix)
    n, d = struct.unpack("<QQ", raw[18:34])
    fields = [(0, 9, "magic", repr(raw[:9])), (9, 8, "version", struct.unpack("<Q", raw[9:17])[0]),
              (17, 1, "dtype code", f"{raw[17]} ({ds.dtype})"), (18, 8, "sequence count N", n),
              (26, 8, "document count D", d),
              (34, 4 * n, "sequence lengths", ds.sequence_lengths.tolist()),
              (34 + 4 * n, 8 * n, "sequence pointers", ds.index.sequence_pointers.tolist()),
              (34 + 12 * n, 8 * d, "document indices", ds.document_indices.tolist())]
    name = os.path.basename(prefix)
    print(f"{name}.idx: {len(raw)} bytes    {name}.bin: {os.path.getsize(prefix + '.bin')} bytes")
    for offset, size, name, value in fields:
        print(f"  @{offset:<4} {size:>3} B  {name:<18} {value}")
    print("\nfirst bytes of the .idx:")
    for row in range(0, 48, 16):
        chunk = raw[row:row + 16]
        print(f"  {row:04x}: {' '.join(f'{b:02x}' for b in chunk)}")
    first, second, size = int(ds.sequence_lengths[0]), int(ds.sequence_lengths[1]), ds.dtype.itemsize
    start = int(ds.index.sequence_pointers[2])
    print(f"\ndocument 2 starts at byte {size} x ({first} + {second}) = {start} of the .bin "
          f"({size} bytes per token) and holds {show(ds[2])!r}")


def cmd_indices(work: str) -> None:
    ds = dataset(work)
    low = ds.dataset
    print("documents (id: length, text)")
    for i in range(len(low)):
        print(f"  {i}: {int(low.sequence_lengths[i]):>3}  {show(low[i])!r}")
    per_epoch, epochs = int(low.sequence_lengths.sum()), len(ds.document_index) // len(low)
    print(f"\n{NUM_SAMPLES} samples of seq_length {SEQ} need {NUM_SAMPLES} x {SEQ} + 1 = "
          f"{NUM_SAMPLES * SEQ + 1} tokens; an epoch has {per_epoch} -> {epochs} epochs, {len(ds)} samples built")
    if epochs > 1:
        before = ((epochs - 1) * per_epoch - 1) // SEQ
        from_final, per_epoch_samples = NUM_SAMPLES - before, (per_epoch - 1) // SEQ
        separate = from_final < int(0.8 * per_epoch_samples)
        print(f"the last epoch supplies {from_final} of the {NUM_SAMPLES} samples; an epoch holds "
              f"{per_epoch_samples}; {from_final} {'<' if separate else '>='} 80% of that (= "
              f"{int(0.8 * per_epoch_samples)}), so the last epoch is shuffled "
              f"{'on its own' if separate else 'together with the others'}")
    print(f"document_index ({len(ds.document_index)}): {ds.document_index.tolist()}")
    print(f"sample_index   ({len(ds.sample_index)} rows of [position in document_index, offset]):")
    rows = ds.sample_index.tolist()
    for start in range(0, len(rows), 8):
        print("  " + "  ".join(f"{k:>2}:{r}" for k, r in enumerate(rows[start:start + 8], start=start)))
    print(f"shuffle_index  ({len(ds.shuffle_index)}): {ds.shuffle_index.tolist()}")


def explain_sample(ds, i: int) -> None:
    k = int(ds.shuffle_index[i])
    (p0, o0), (p1, o1) = ds.sample_index[k].tolist(), ds.sample_index[k + 1].tolist()
    print(f"sample {i} -> shuffle_index[{i}] = {k} -> sample_index[{k}] = [{p0}, {o0}], "
          f"sample_index[{k + 1}] = [{p1}, {o1}]")
    for p in range(p0, p1 + 1):
        doc = int(ds.document_index[p])
        start = o0 if p == p0 else 0
        stop = o1 + 1 if p == p1 else int(ds.dataset.sequence_lengths[doc])
        print(f"  document_index[{p}] = document {doc}, tokens [{start}, {stop}): "
              f"{show(ds.dataset.get(doc, start, stop - start))!r}")
    item = ds[i]
    print(f"  tokens: {show(item['tokens'])!r}\n  labels: {show(item['labels'])!r}")


def cmd_sample(work: str, i: int | None) -> None:
    """Sample i, or (no i) the first sample in shuffled order that spans two documents."""
    ds = dataset(work)
    if i is None:
        spans = lambda j: ds.sample_index[int(ds.shuffle_index[j])][0] != ds.sample_index[int(ds.shuffle_index[j]) + 1][0]
        i = next(j for j in range(len(ds)) if spans(j))
    explain_sample(ds, i)


def cmd_samplers(work: str) -> None:
    from minitron.training.datasets.data_samplers import MegatronPretrainingSampler
    ds = dataset(work)
    micro, dp, gbs = 2, 2, 8
    print(f"{len(ds)} samples, micro batch {micro}, dp {dp}, global batch {gbs} "
          f"-> {gbs // (micro * dp)} micro-batches per iteration per rank")
    iters = {r: iter(MegatronPretrainingSampler(len(ds), 0, micro, r, dp)) for r in range(dp)}
    for it in range(3):
        line = "   ".join(f"dp rank {r}: {[next(iters[r]) for _ in range(gbs // (micro * dp))]}"
                          for r in range(dp))
        print(f"  iteration {it}  consumed before = {it * gbs:>2}   {line}")
    resumed = {r: iter(MegatronPretrainingSampler(len(ds), 2 * gbs, micro, r, dp)) for r in range(dp)}
    line = "   ".join(f"dp rank {r}: {[next(resumed[r]) for _ in range(gbs // (micro * dp))]}" for r in range(dp))
    print(f"resumed with consumed_samples = {2 * gbs}:  {line}")


def cmd_token(work: str) -> None:
    from minitron.training.datasets.data_samplers import MegatronPretrainingSampler
    ds = dataset(work)
    iteration, dp_rank, microbatch, row, position = 1, 1, 0, 1, 5
    micro, dp, gbs = 2, 2, 8
    sampler = iter(MegatronPretrainingSampler(len(ds), 0, micro, dp_rank, dp))
    per_iter = gbs // (micro * dp)
    batches = [next(sampler) for _ in range((iteration + 1) * per_iter)]
    sample = batches[iteration * per_iter + microbatch][row]
    print(f"iteration {iteration}, dp rank {dp_rank}, micro-batch {microbatch}, row {row}, position {position}:")
    print(f"  sampler -> dataset index {sample}")
    explain_sample(ds, sample)
    token = int(ds[sample]["tokens"][position])
    print(f"  tokens[{position}] = {token} = {show([token])!r}; the model must predict "
          f"labels[{position}] = {show([int(ds[sample]['labels'][position])])!r}")


def cmd_barrier(work: str) -> None:
    import minitron.training.data  # noqa: F401
    from minitron.core import parallel_state as mpu
    from minitron.core.datasets import BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig
    from minitron.launcher import LaunchConfig, run_on_ranks, session_env
    from minitron.pretrain_gpt import is_dataset_built_on_rank
    from minitron.trace.reader import load_trace
    from minitron.training.tokenizer import ByteLevelTokenizer
    prefix, trace_dir = build_corpus(work), os.path.join(work, "trace")

    def rank_main(rank: int) -> None:
        mpu.initialize_model_parallel(2, 1)
        cfg = GPTDatasetConfig(random_seed=SEED, sequence_length=SEQ, blend=([prefix], None), split="90,10,0",
                               path_to_cache=os.path.join(work, "cache"), tokenizer=ByteLevelTokenizer())
        BlendedMegatronDatasetBuilder(GPTDataset, [NUM_SAMPLES, 4, 0], is_dataset_built_on_rank, cfg).build()
        mpu.destroy_model_parallel()

    run_on_ranks(rank_main, LaunchConfig(world_size=4, env=session_env(4, trace_dir), warm=()))
    print("tensor parallel 2, pipeline 1: global ranks 0 and 2 are tensor-parallel rank 0;")
    print("_build_indices appears where the indices were computed, not where they were loaded\n")
    for rank, records in sorted(load_trace(trace_dir).items()):
        print(f"rank {rank}")
        _print_subtree(records, "BlendedMegatronDatasetBuilder.build")


def _print_subtree(records, root_name: str) -> None:
    children: dict = {}
    for r in sorted(records, key=lambda r: r["start_us"]):
        children.setdefault(r["parent"], []).append(r)
    roots = [r for r in records if r["name"].endswith(root_name)]
    keep = ("built_here", "split", "cls")

    def walk(r, depth):
        args = {k: v for k, v in r["args"].items() if k in keep}
        name = r["name"].rsplit(".", 2)
        short = name[-1] if name[-2][0].islower() else ".".join(name[-2:])
        extra = "  " + " ".join(f"{k}={v}" for k, v in args.items()) if args else ""
        ms = (r["end_us"] - r["start_us"]) / 1000
        print(f"  {'  ' * depth}{short}{extra}".ljust(84) + f"{ms:7.1f} ms")
        for c in children.get(r["id"], []):
            walk(c, depth + 1)

    for r in roots:
        walk(r, 0)


def main(argv: list[str]) -> int:
    commands = {"layout": cmd_layout, "indices": cmd_indices, "samplers": cmd_samplers,
                "token": cmd_token, "barrier": cmd_barrier}
    if not argv or (argv[0] not in commands and argv[0] != "sample"):
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory() as work:
        if argv[0] == "sample":
            cmd_sample(work, int(argv[1]) if len(argv) > 1 else None)
        else:
            commands[argv[0]](work)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
