"""A torch_dist checkpoint's files, checked before any rank starts (checkpoint_files.py does the
rest): every file whole, DCP's ``.metadata`` readable without running a foreign pickle, each
``.distcp`` file the one ``.metadata`` describes and signed by the rank whose items DCP reads
from it (core/dist_checkpointing/file_owner.py), and ``common.pt`` loadable as data."""

from __future__ import annotations

from minitron.training.checkpoint_files import CheckpointError, check_loadable, iteration_dir, verify_file


def check_sharded_files(root, iteration: int, meta: dict) -> None:
    """A torch_dist checkpoint: every file its metadata.json lists, whole (size and sha256); then
    DCP's .metadata, unpickled by a reader that admits only DCP's own metadata classes (DCP
    itself would run any pickle); then common.pt through torch's weights-only load."""
    where = iteration_dir(root, iteration)
    for rel in sorted(meta.get("files", {})):
        verify_file(where / rel, meta, rel)
    import pickle   # lazy, as torch below: only a torch_dist checkpoint needs either
    import torch  # lazy: the checks above are torch-free, and the launcher refuses them first

    class DCPMetadataOnly(pickle.Unpickler):
        def find_class(self, module, name):
            if module.startswith("torch.distributed.checkpoint.") or module in ("pathlib", "collections") or \
                    (module, name) in {("torch", "Size"), ("torch.serialization", "_get_layout")} or \
                    (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
                return super().find_class(module, name)
            raise pickle.UnpicklingError(f"it names {module}.{name}, which is not DCP's metadata")
    try:
        with open(where / ".metadata", "rb") as f:
            dcp = DCPMetadataOnly(f).load()
        spans = {}   # each .distcp file -> the (offset, length) of every item .metadata places in it
        for info in dcp.storage_data.values():
            spans.setdefault(info.relative_path, []).append((info.offset, info.length))
    except (pickle.UnpicklingError, EOFError, OSError, AttributeError, ImportError, TypeError) as exc:
        raise CheckpointError(f"{where / '.metadata'} is not readable DCP metadata ({exc}): resume from another "
                              f"checkpoint") from None
    from minitron.core.dist_checkpointing.file_owner import read_file_owner   # lazy: it brings torch's package
    owners = {name: read_file_owner(where / name) for name in spans if (where / name).is_file()}
    problem = _owner_problem(where, owners, meta)
    if problem:
        raise CheckpointError(problem)
    for name, items in sorted(spans.items()):
        # Each writer's items fill its file end to end (up to its owner record); a file of another
        # writer, moved here under this name with its checksum re-signed, rarely fits the ranges.
        ends = [0] + [offset + length for offset, length in sorted(items)]
        path = where / name
        if [offset for offset, _ in sorted(items)] != ends[:-1] or name not in owners or \
                owners[name][1] != ends[-1]:
            raise CheckpointError(f"{path} is not the file .metadata describes (its items do not fill it "
                                  f"end to end): was it moved or renamed from another rank's? put each file "
                                  f"back where the save wrote it, or resume from another checkpoint")
    check_loadable(where / "common.pt")


_PUT_BACK = "put each file back where the save wrote it, or resume from another checkpoint"


def _owner_problem(where, owners: dict, meta: dict) -> str | None:
    """The one line that refuses a .distcp file in another writer's place, or None. ``owners``:
    file name -> (its owner record or None, where its items end). DCP reads rank r's items from
    the file named __r_0.distcp, so a record naming another rank means the files were moved;
    a file without a record among signed ones came from elsewhere (an older save)."""
    # lazy, both torch-free modules: their packages' __init__ import torch, which this check,
    # run before any rank starts, reaches only after every torch-free refusal
    from minitron.core.dist_checkpointing.file_owner import writer_rank
    from minitron.runtime.checkpoint.shard_owner import describe
    by_rank = {rec.get("rank"): rec for rec, _ in owners.values() if rec}
    for name, (record, _) in sorted(owners.items()):
        path, rank = where / name, writer_rank(name)
        if record is None:
            if by_rank:
                return (f"{path} carries no owner record, but the other .distcp files of this save do: it was "
                        f"copied in from another checkpoint; {_PUT_BACK}")
            continue   # an older minitron's (or Megatron's) checkpoint: no file makes a claim
        sizes = [k for k in ("world_size", "tensor_model_parallel_size", "pipeline_model_parallel_size",
                             "data_parallel_size") if k in meta and k in record and record[k] != meta[k]]
        if sizes:
            said = ", ".join(f"{k.replace('_', '-')} {record[k]}" for k in sizes)
            return (f"{path} was written by a run with {said}, not the layout {where / 'metadata.json'} records "
                    f"({', '.join(str(meta[k]) for k in sizes)}): it came from another checkpoint; {_PUT_BACK}")
        if rank is not None and record.get("rank") != rank:
            belongs = f" ({describe(by_rank[rank])})" if rank in by_rank else ""
            return (f"{path} holds the items of rank {record.get('rank')} ({describe(record)}), but .metadata reads "
                    f"rank {rank}'s{belongs} from it: files were moved or renamed between ranks; {_PUT_BACK}")
    return None
