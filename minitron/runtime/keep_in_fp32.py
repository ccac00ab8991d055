"""``data_types.keep_in_fp32_modules`` (DeepSpeed 0.19.8's ``runtime/keep_in_fp32.py``): the
buffers a model names stay fp32 while the rest of it trains in fp16 or bf16.

Why: some buffers hold values that 16 bits cannot tell apart. DeepSpeed's example is the MoE
router's score-correction bias, values near 5-20 that differ by less than 0.01, where bf16's
spacing there is 0.03-0.125: in bf16 most experts' biases collapse onto a few values and tokens
go to other experts. transformers names such tensors on the model class
(``_keep_in_fp32_modules_strict``, and for fp16 also ``_keep_in_fp32_modules``); "auto" reads
those lists, a list of patterns replaces them, ``[]`` keeps nothing. Only buffers: parameters
follow the training dtype whatever the lists say.
"""

from __future__ import annotations

import re

import torch


def keep_in_fp32_pattern(module, setting, dtype_name: str):
    """The names to keep in fp32 as one regex (None: nothing). "auto": the model's own lists, as
    transformers names them (``_keep_in_fp32_modules_strict``, and under fp16 also
    ``_keep_in_fp32_modules``), each anchored under the module that lists it; a list: its
    patterns, ``*`` for any characters, matched anywhere in the buffer's full name."""
    if dtype_name not in ("fp16", "bf16"):
        return None
    if setting == "auto":
        patterns = set()
        for name, child in module.named_modules():
            listed = set(getattr(child, "_keep_in_fp32_modules_strict", None) or [])
            if dtype_name == "fp16":
                listed |= set(getattr(child, "_keep_in_fp32_modules", None) or [])
            for entry in listed:
                pattern = entry.replace("*", ".*")
                patterns.add(rf"^{re.escape(name)}\..*{pattern}" if name else pattern)
    else:
        patterns = {entry.replace("*", ".*") for entry in setting}
    return re.compile("|".join(sorted(patterns))) if patterns else None


def keep_buffers_in_fp32(module, pattern) -> int:
    """Each floating buffer whose full name matches, back to fp32; how many changed."""
    changed = 0
    for owner_name, owner in module.named_modules():
        prefix = f"{owner_name}." if owner_name else ""
        for name, buf in owner.named_buffers(recurse=False):
            if buf is not None and buf.is_floating_point() and pattern.search(prefix + name) \
                    and buf.dtype != torch.float32:
                buf.data = buf.data.float()
                changed += 1
    return changed
