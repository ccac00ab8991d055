"""Megatron's data stack: indexed .bin/.idx files, GPT samples, blends, and their builder.

    IndexedDataset -> GPTDataset (one split, as samples) -> BlendedDataset (several, by weight)
                      \\__ built by BlendedMegatronDatasetBuilder on the ranks that need them

``from minitron.core.datasets import GPTDataset`` works as usual, but each name is imported
from its module only when it is first asked for (PEP 562). Importing any one module of the
package runs this file first, and the command line imports one (the --split parser) before any
rank starts: that must cost that module, not every module's numpy and torch.
"""

from importlib import import_module

# name -> the module of this package that defines it
_EXPORTS = {
    "BlendedDataset": "blended_dataset",
    "BlendedMegatronDatasetBuilder": "blended_megatron_dataset_builder",
    "BlendedMegatronDatasetConfig": "blended_megatron_dataset_config",
    "GPTDataset": "gpt_dataset", "GPTDatasetConfig": "gpt_dataset", "MockGPTDataset": "gpt_dataset",
    "DType": "indexed_dataset", "IndexedDataset": "indexed_dataset",
    "IndexedDatasetBuilder": "indexed_dataset", "IndexedDatasetError": "indexed_dataset",
    "Split": "utils", "get_blend_from_list": "utils",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value  # the next lookup finds it without coming here
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
