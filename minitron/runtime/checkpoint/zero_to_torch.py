#!/usr/bin/env python
"""zero_to_fp32.py's weights in the dtype you ask for: DeepSpeed 0.19.8 copies a second script,
``zero_to_torch.py``, beside its checkpoints for this, and minitron's engine copies this one.

    python zero_to_torch.py CHECKPOINT_DIR OUTPUT_FILE --dtype bf16 [--tag global_step3]

Only floating-point tensors change dtype; integer buffers (counters, indices) stay exact.
"""

import argparse
import sys

import torch

try:  # copied beside its sibling into a checkpoint folder, and run there as a script
    import zero_to_fp32
except ImportError:  # imported as part of minitron's package
    from . import zero_to_fp32

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint_dir", help="the folder holding 'latest' and the tags")
    parser.add_argument("output_file", help="where to torch.save the state dict")
    parser.add_argument("--dtype", required=True, choices=sorted(DTYPES), help="the weights' dtype")
    parser.add_argument("--tag", default=None, help="a tag folder; default: the one 'latest' names")
    args = parser.parse_args()
    try:
        state = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(args.checkpoint_dir, args.tag)
    except FileNotFoundError as missing:   # one line, as for any bad input, and exit code 2
        print(f"zero_to_torch.py: {missing}", file=sys.stderr)
        sys.exit(2)
    dtype = DTYPES[args.dtype]
    torch.save({n: t.to(dtype) if t.is_floating_point() else t for n, t in state.items()}, args.output_file)


if __name__ == "__main__":
    main()
