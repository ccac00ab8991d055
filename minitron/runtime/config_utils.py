"""Reading a ds_config into a dict, as DeepSpeed 0.19.8 reads it: its ``runtime/config_utils.py``
(``dict_raise_error_on_duplicate_keys``) and the hjson reader its ``DeepSpeedConfig`` opens a
file with.

That reader is hjson, not json, and that decides more than one might think: a whole number
written with a fraction or an exponent arrives as an int (``hjson_number``). A dict given by a
program is taken as it is, its floats read by the same rule, so both ways in resolve alike.
Every refusal is one ``DeepSpeedConfigError`` line naming the file. Torch-free, like the rest
of the config: ``minitron ds-config`` and the estimator read it without torch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Union

from minitron.runtime.config_values import DeepSpeedConfigError


def dict_raise_error_on_duplicate_keys(pairs):
    """json's object hook: a key given twice is refused (DeepSpeed's same-named hook), where plain
    json would keep the last value without a word."""
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise DeepSpeedConfigError(f"duplicate key {key!r}")
        seen[key] = value
    return seen


def hjson_number(text: str) -> Union[int, float]:
    """A JSON number with a fraction or an exponent, as DeepSpeed's reader (hjson 3.1) returns it:
    a whole value below 1e10 becomes an int. So ``"stage": 1.0``, ``"train_batch_size": 8.0`` and
    ``"reduce_bucket_size": 5e8`` (the form DeepSpeed's own docs use) reach DeepSpeed as 1, 8 and
    500000000, and must here too; ``1e30`` stays a float, and 1e400 is infinite (hjson refuses
    it, and every number check here refuses what is not finite)."""
    value = float(text)
    return int(value) if math.isfinite(value) and value.is_integer() and abs(value) < 1e10 else value


def _as_hjson_reads(value):
    """A dict given by a program, its floats made what hjson would have made of them in a file:
    one rule for both ways in (a dict, to DeepSpeed, is taken as it is; its pydantic models
    then turn a whole float into an int anyway, and its batch arithmetic gives the same
    numbers)."""
    if isinstance(value, dict):
        return {k: _as_hjson_reads(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_hjson_reads(v) for v in value]
    return hjson_number(repr(value)) if type(value) is float else value


def load_config(config: Union[str, Path, dict]) -> dict:
    """The config as a dict: a dict is taken as is (its floats read as hjson reads them), a path
    is read as JSON (duplicate keys refused, as DeepSpeed refuses them)."""
    if isinstance(config, dict):
        try:
            return _as_hjson_reads(config)
        except RecursionError:
            raise DeepSpeedConfigError("the ds_config dict is nested too deeply to be a ds_config") from None
    path = Path(config)
    if not path.is_file():
        raise DeepSpeedConfigError(f"{path}: no such file; give the path of a ds_config JSON file")
    try:
        # Infinity and NaN are not JSON (hjson reads them as the text "Infinity"); json gives
        # floats, which every number check of the config refuses by the key's name.
        data = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=dict_raise_error_on_duplicate_keys,
                          parse_float=hjson_number)
    except UnicodeDecodeError as exc:
        raise DeepSpeedConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise DeepSpeedConfigError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except DeepSpeedConfigError as exc:
        raise DeepSpeedConfigError(f"{path}: {exc}") from None
    except RecursionError:
        raise DeepSpeedConfigError(f"{path}: nested too deeply to be a ds_config (a few levels of objects)") from None
    except ValueError:  # Python's cap on integer digits (4300), which hjson hits too
        raise DeepSpeedConfigError(f"{path}: a number of more than 4300 digits, which neither Python's json nor "
                                   f"DeepSpeed's hjson reads; no ds_config value needs one") from None
    if not isinstance(data, dict):
        raise DeepSpeedConfigError(f"{path}: a ds_config is a JSON object, got {type(data).__name__}")
    return data
