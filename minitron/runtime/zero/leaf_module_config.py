"""The ``leaf_module`` section of zero_optimization, read without torch (DeepSpeed 0.19.8's
``zero/leaf_module_config.py``): a ds_config is checked before any process starts, and the
command that checks it never imports torch. What a leaf module is: leaf_modules.py.
"""

from __future__ import annotations

from minitron.runtime.config_values import DeepSpeedConfigError, check_keys, json_value

DEFAULT_CLASSES = ("transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",
                   "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
                   "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock")
KEYS = ("classes", "names", "name_suffixes")


def parse_leaf_module(zero: dict, where: str) -> tuple:
    """((classes), (names), (name_suffixes)); a string stands for a list of one, as DeepSpeed's
    model coerces it, and repeats are dropped."""
    section = zero.get("leaf_module")
    if section is None:
        return DEFAULT_CLASSES, (), ()
    if not isinstance(section, dict):
        raise DeepSpeedConfigError(f"{where}.leaf_module must be an object with classes, names or name_suffixes, "
                                   f"got {json_value(section)}")
    check_keys(section, KEYS, {}, f"{where}.leaf_module")
    out = []
    for key, default in zip(KEYS, (DEFAULT_CLASSES, (), ())):
        value = section.get(key, default)
        value = [value] if isinstance(value, str) else value
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise DeepSpeedConfigError(f"{where}.leaf_module.{key} must be a list of strings, got {json_value(value)}")
        out.append(tuple(dict.fromkeys(value)))
    return tuple(out)
