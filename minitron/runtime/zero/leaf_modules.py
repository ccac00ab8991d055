"""ZeRO-3 leaf modules: DeepSpeed 0.19.8's ``utils/z3_leaf_module.py``, the ``leaf_module``
config (``zero/leaf_module_config.py``) and ``stage3_module_granularity_threshold``
(``parameter_offload.py``'s ``_set_z3_leaf_modules_by_threshold``).

Stage 3 gathers a module's own parameters before it runs, module by module. A *leaf* module is
gathered whole instead: its parameters and all its descendants', in one gather before its
forward and one before its backward, and its descendants get no hooks at all. That pays for
many small modules (one gather in place of many) and is needed where a module picks which
children run (an MoE block's experts): the trace would change from pass to pass.

    (the section is read, torch-free, by leaf_module_config.py)

    leaf_module.classes         class names, short or module-qualified (DeepSpeed's default:
                                three Hugging Face MoE blocks, which minitron's models are not)
    leaf_module.names           module names as named_modules() gives them
    leaf_module.name_suffixes   the ends of such names
    stage3_module_granularity_threshold
                                a module whose parameters per layer (its own and its
                                descendants', over the count of torch leaf modules below it plus
                                one) are at most this many becomes a leaf; parents first, and
                                never a container (Sequential, ModuleList...) or a module of more
                                than 1e9 elements
"""

from __future__ import annotations

import sys

import torch

MAX_LEAF = 1e9   # DeepSpeed's Z3_MAX_LEAF_SIZE: a larger leaf would hold too much at once
CONTAINERS = tuple(torch.nn.modules.container.__all__)


def z3_leaf_module(module: torch.nn.Module) -> bool:
    return getattr(module, "_z3_leaf", False)


def set_leaf_modules(module: torch.nn.Module, leaf: tuple, threshold: int) -> list:
    """Mark the config's leaf modules (``_z3_leaf``, DeepSpeed's flag), then those under the
    granularity threshold; the names of those marked, in the module's order."""
    classes, names, suffixes = leaf
    for name, m in module.named_modules():
        qualified = f"{type(m).__module__}.{type(m).__qualname__}"
        if type(m).__name__ in classes or qualified in classes or name in names \
                or any(name.endswith(s) for s in suffixes if name):
            m._z3_leaf = True
    if threshold > 0:
        _granularity(module)
        _leaf_by_threshold(module, threshold)
    return [name for name, m in module.named_modules() if z3_leaf_module(m)]


def _granularity(module: torch.nn.Module) -> tuple:
    """(torch leaf modules, parameter elements) below and in ``module``; sets its
    ``ds_model_granularity``, elements per layer (sys.maxsize: never a leaf)."""
    numel = sum(getattr(p, "ds_numel", p.numel()) for p in module.parameters(recurse=False))
    module.ds_model_granularity = sys.maxsize
    if not list(module.parameters()):
        return 0, 0
    if not any(module.children()):
        return 1, numel
    layers = 0
    for child in module.children():
        child_layers, child_numel = _granularity(child)
        layers, numel = layers + child_layers, numel + child_numel
    if type(module).__name__ in CONTAINERS:
        return layers, numel
    layers += 1
    module.ds_model_granularity = numel // layers if numel <= MAX_LEAF else sys.maxsize
    return layers, numel


def _leaf_by_threshold(module: torch.nn.Module, threshold: int) -> None:
    if not list(module.parameters()):
        return
    if module.ds_model_granularity <= threshold:
        module._z3_leaf = True
        return
    for child in module.children():
        _leaf_by_threshold(child, threshold)
