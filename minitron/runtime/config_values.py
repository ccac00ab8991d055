"""How DeepSpeed 0.19.8 reads one ds_config value, and the one-line refusal where it would not.

A value's key decides which of two ways:

* raw: ``get_scalar_param`` hands the JSON value on as it is (the batch triad, steps_per_print,
  gradient_clipping, the optimizer's and scheduler's params). A string where a number goes
  fails later there, in arithmetic or in torch; here at once.
* through a pydantic model (the ``fp16``, ``bf16`` and ``zero_optimization`` sections), in
  pydantic v2's lax mode, which converts: a value "auto" is dropped (DeepSpeedConfigModel drops
  it, leaving the default), a whole float or a string of digits becomes an int, 0/1 and
  "yes"/"off"/"true"... a bool. Those are accepted here too, as what pydantic makes of them.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from typing import Any, Optional


class DeepSpeedConfigError(ValueError):
    """A bad ds_config value; the message is one line naming the key."""


def check_keys(section: dict, known: tuple, default_only: dict, where: str, model: bool = False) -> None:
    """Refuse keys minitron does not read. ``default_only`` keys are accepted at DeepSpeed's
    default value only (it is what minitron does anyway), so real configs that spell the default
    out still load. ``model``: the section is a pydantic model's, whose bools are lax."""
    for key, value in section.items():
        if key in known:
            continue
        if key in default_only:
            default = default_only[key]
            if model and isinstance(default, bool):
                value = lax_bool(value)
            if value != default or isinstance(value, bool) != isinstance(default, bool):
                raise DeepSpeedConfigError(f"{where}.{key}: minitron implements only {json_value(default)} "
                                           f"(DeepSpeed's default), got {json_value(section[key])}")
            continue
        close = difflib.get_close_matches(key, list(known) + list(default_only), n=1, cutoff=0.7)
        hint = f"; did you mean {close[0]!r}?" if close else f"; minitron reads {', '.join(known)}"
        raise DeepSpeedConfigError(f"{where}: unknown key {key!r}{hint}")


def json_value(value: Any) -> str:
    """The value as the JSON file spells it, cut short (a 4,000-digit number stays one line)."""
    if isinstance(value, bool) or value is None:
        text = json.dumps(value)
    elif isinstance(value, float) and not math.isfinite(value):
        text = "NaN" if value != value else "Infinity" if value > 0 else "-Infinity"
    elif isinstance(value, int) and value.bit_length() > 256:  # repr itself refuses past 4300 digits
        text = f"an integer of {int(value.bit_length() * math.log10(2)) + 1} digits"
    else:
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def positive_int(section: dict, key: str, allow_none: bool = False, where: str = "", minimum: Optional[int] = 1,
                 maximum: Optional[int] = None) -> Optional[int]:
    """A whole number read raw: a JSON integer (a file's 8.0 is one already, see
    config_utils.hjson_number). ``minimum`` None: the caller checks the sign (the batch triad, with
    DeepSpeed's own messages)."""
    value = section.get(key)
    if value is None and allow_none:
        return None
    return _bounded(value, f"{where}.{key}" if where else key, minimum, maximum)


def _bounded(value, name: str, minimum: Optional[int], maximum: Optional[int]) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        why = " (hjson, DeepSpeed's reader, makes whole numbers below 1e10 integers; this stays a float)" \
            if type(value) is float and math.isfinite(value) and value.is_integer() else ""
        raise DeepSpeedConfigError(f"{name} must be a whole number, got {json_value(value)}{why}")
    if minimum is not None and value < minimum:
        raise DeepSpeedConfigError(f"{name} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise DeepSpeedConfigError(f"{name} must be at most {maximum}, got {value}")
    return value


def number(section: dict, key: str, default: float, where: str, low: float = -math.inf,
           high: float = math.inf) -> float:
    """A finite number in [low, high]. Not finite is never a value DeepSpeed takes: its reader
    (hjson) has no Infinity or NaN, and reads 1e400 as an error."""
    value = section.get(key, default)
    name = f"{where}.{key}" if where else key
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        bounds = f" in [{low:g}, {high:g}]" if math.isfinite(high) else f" >= {low:g}" if math.isfinite(low) else ""
        raise DeepSpeedConfigError(f"{name} must be a finite number{bounds}, got {json_value(value)}")
    return float(value)


def flag(section: dict, key: str, default: bool, where: str) -> bool:
    value = section.get(key, default)
    if not isinstance(value, bool):
        raise DeepSpeedConfigError(f"{where}.{key} must be true or false, got {json_value(value)}")
    return value


# --- the pydantic sections ---------------------------------------------------------------------

def model_view(section: dict) -> dict:
    """The section as DeepSpeedConfigModel.__init__ passes it on: without the values "auto"
    (the Hugging Face integration writes them; the field's default stands)."""
    return {k: v for k, v in section.items() if v != "auto"}


_DIGITS = re.compile(r"\s*[+-]?\d+(_\d+)*(\.0+)?\s*")  # "1.0" too, as pydantic reads it
_TRUE = {"1", "on", "t", "true", "y", "yes"}
_FALSE = {"0", "off", "f", "false", "n", "no"}


def _lax_int(value, bools: bool = True) -> Optional[int]:
    """pydantic v2's lax int, or None where it refuses."""
    if isinstance(value, bool):
        return int(value) if bools else None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else None
    if isinstance(value, str) and _DIGITS.fullmatch(value) and len(value) < 4300:
        return int(value.strip().split(".")[0])
    return None


def lax_bool(value) -> Optional[bool]:
    """pydantic v2's lax bool, or None where it refuses."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    return None


def model_int(section: dict, key: str, default: int, where: str, minimum: int = 1, maximum: Optional[int] = None,
              bools: bool = True) -> int:
    """An ``int`` field. ``bools``: False where a DeepSpeed validator refuses true/false first
    (fp16's loss_scale_window and min_loss_scale)."""
    if key not in section:
        return default
    value = _lax_int(section[key], bools)
    return _bounded(section[key] if value is None else value, f"{where}.{key}", minimum, maximum)


def model_flag(section: dict, key: str, default: bool, where: str) -> bool:
    """A ``bool`` field (``Optional[bool]`` ones take null as "the default" before calling this)."""
    if key not in section:
        return default
    value = lax_bool(section[key])
    if value is None:
        raise DeepSpeedConfigError(f"{where}.{key} must be true or false, got {json_value(section[key])}")
    return value


def model_number(section: dict, key: str, default: float, where: str, low: float) -> float:
    """fp16.loss_scale: DeepSpeed's validator takes float(value) of anything but a bool."""
    value = section.get(key, default)
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    return number({key: value}, key, default, where, low=low)
