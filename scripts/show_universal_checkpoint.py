"""What a universal checkpoint holds, folder by folder (minitron/runtime/checkpoint/ds_to_universal.py).

    python scripts/show_universal_checkpoint.py UNI [PARAMETER]

UNI is the folder holding latest_universal; PARAMETER one parameter's name (default: the first).
Prints the tag, its files, how many parameter folders ``zero/`` has, what one of them holds
(each state's shape and dtype, beside the parameter's shape in param_shapes) and the keys of
optimizer_state.pt.
"""

from __future__ import annotations

import sys
from pathlib import Path


def _describe(value) -> str:
    import torch   # only once the arguments are good

    tensor = value["param"] if isinstance(value, dict) else value
    if not torch.is_tensor(tensor):
        return repr(value)
    form = "{'param': ..., 'cat_dim': 0}" if isinstance(value, dict) else "a bare tensor"
    return f"{tuple(tensor.shape)} {str(tensor.dtype).replace('torch.', '')}, {form}"


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else None
    if root is None or not (root / "latest_universal").is_file():
        print("show_universal_checkpoint: give the folder that holds latest_universal", file=sys.stderr)
        return 2
    from minitron.runtime.checkpoint.pickles import load_state   # torch: only past the argument check

    tag = root / (root / "latest_universal").read_text().strip()
    print(f"latest_universal -> {tag.name}")
    for path in sorted(tag.iterdir()):
        print(f"  {path.name}{'/' if path.is_dir() else ''}")
    zero = tag / "zero"
    folders = sorted(p for p in zero.iterdir() if p.is_dir())
    print(f"zero/: {len(folders)} parameter folders and optimizer_state.pt")
    model = load_state(next(iter(sorted(tag.glob("*_model_states.pt")))))
    shapes = {n: s for group in model["param_shapes"] for n, s in group.items()}
    name = argv[1] if len(argv) > 1 else folders[0].name
    print(f"zero/{name}/ (param_shapes: {tuple(shapes[name])}):")
    for path in sorted((zero / name).iterdir()):
        print(f"  {path.name:<15} {_describe(load_state(path))}")
    print(f"zero/optimizer_state.pt: {', '.join(load_state(zero / 'optimizer_state.pt'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
