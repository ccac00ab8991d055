"""A torch_dist checkpoint's files, checked before any rank starts (checkpoint_files.py does the
rest): every file whole, DCP's ``.metadata`` readable without running a foreign pickle, each
``.distcp`` file the one ``.metadata`` describes, and ``common.pt`` loadable as data."""

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
    for name, items in sorted(spans.items()):
        # Each writer's items fill its file end to end; a file of another writer, moved here under
        # this name with its checksum re-signed, does not fit the ranges DCP would read from it.
        ends = [0] + [offset + length for offset, length in sorted(items)]
        path = where / name
        if [offset for offset, _ in sorted(items)] != ends[:-1] or not path.is_file() or \
                path.stat().st_size != ends[-1]:
            raise CheckpointError(f"{path} is not the file .metadata describes (its items do not fill it "
                                  f"end to end): was it moved or renamed from another rank's? put each file "
                                  f"back where the save wrote it, or resume from another checkpoint")
    check_loadable(where / "common.pt")
