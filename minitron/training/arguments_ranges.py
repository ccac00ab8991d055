"""The types that Megatron's flags are parsed with: each number's range, stated once, with its flag.

argparse applies these types to what the user typed, so `--exit-interval -1` or `--lr nan` is
refused while parsing, in one line ("argument --lr: must be a finite number, got nan"),
whichever code reads it later. Every size and count also has a ceiling, and the refusal says why
it is there. Kept apart from argument_groups.py (the flags themselves) so each reads in one
sitting; nothing here imports beyond argparse.
"""

from __future__ import annotations

import argparse


def int_in(low: int, high: int | None = None, why: str = ""):
    """A whole number from ``low`` to ``high``; ``why`` tells a user who went past ``high``
    why that is the largest value taken."""
    def parse(text: str) -> int:
        try:
            value = int(text) if len(text) <= 40 else None
        except ValueError:
            value = None
        if value is None and text.strip().isascii() and text.strip().lstrip("+-").isdigit():
            raise argparse.ArgumentTypeError(f"must be at most {high if high is not None else 10**40:,}, got a "
                                             f"number of {len(text.strip()):,} digits")
        if value is None:
            shown = text if len(text) <= 40 else text[:20] + "..."
            raise argparse.ArgumentTypeError(f"expected a whole number, got {shown!r}")
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        if high is not None and value > high:
            reason = f" ({why})" if why else ""
            raise argparse.ArgumentTypeError(f"must be at most {high:,}, got {value:,}{reason}")
        return value
    return parse


def float_in(low: float, high: float | None = None, *, above: bool = False, below: bool = False, why: str = ""):
    """A finite number >= low (> low with ``above``) and <= high (< high with ``below``); ``why``
    as for int_in."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text[:40]!r}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text[:40]}")
        too_low = value <= low if above else value < low
        too_high = high is not None and (value >= high if below else value > high)
        lo = f"{'>' if above else '>='} {low:g}"
        hi = "" if high is None else f"{'<' if below else '<='} {high:g}"
        if why and too_high:   # a ceiling of ours: say why it is there
            raise argparse.ArgumentTypeError(f"must be {hi}, got {value:g} ({why})")
        if too_low or too_high:   # without a why, the range is the quantity's own (a probability)
            bound = lo if why or not hi else f"{lo} and {hi}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value:g}")
        return value
    return parse


# Every size and count has a ceiling, so that no product of them reaches a size no machine
# holds before the memory check can say so (and no 40-digit number reaches float arithmetic).
_MAX = 2**31 - 1
_WHY_MAX = "the largest size or count minitron takes: tensor shapes and dataset indices are 32-bit here"
POSITIVE, COUNT = int_in(1, _MAX, _WHY_MAX), int_in(0, _MAX, _WHY_MAX)  # a size or interval (>= 1); a count
# The accountant and the model walk every layer; the deepest published GPTs have under 200.
MAX_LAYERS = 1024
LAYERS = int_in(1, MAX_LAYERS, "the deepest published GPTs have under 200 layers; estimate and the model "
              "walk each one")
# Published MoE GPTs have up to 256 routed experts a layer (DeepSeek-V3); the accountant lists
# each expert's weights in every MoE layer. With E <= 1024 and top-k >= 1, a capacity factor of
# E / k = 1024 already lets one expert take every token: more is the same run.
MAX_EXPERTS = 1024
EXPERTS = int_in(0, MAX_EXPERTS, "published MoE GPTs have up to 256 experts a layer; the accountant lists each one")
CAPACITY = float_in(0.0, float(MAX_EXPERTS), above=True, why=f"with at most {MAX_EXPERTS} experts, a factor of "
                  f"{MAX_EXPERTS} already lets one expert take every token")
# The loss times the scale must stay finite in float32 (which ends near 2**128); Megatron starts at 2**32.
LOSS_SCALE = float_in(0.0, 2.0**64, above=True, why="2**64: the loss times the scale must stay finite in float32, "
                    "whose range ends near 2**128; Megatron starts at 2**32")
PROBABILITY = float_in(0.0, 1.0, below=True)


def window_size(text: str) -> tuple[int, int]:
    """--window-size LEFT,RIGHT (Megatron's tuple form): tokens seen back and ahead; -1: no limit."""
    parts = text.replace("(", "").replace(")", "").split(",")
    try:
        left, right = (int(p) for p in parts) if len(parts) == 2 else (None, None)
    except ValueError:
        left = right = None
    if left is None or min(left, right) < -1 or max(left, right) > _MAX:
        raise argparse.ArgumentTypeError(f"expected LEFT,RIGHT, two whole numbers of tokens (-1: no limit), "
                                         f"as in 128,0; got {text[:40]!r}")
    return left, right


def layer_pattern(text: str) -> int | list[int]:
    """Megatron's frequency form: N (every N-th layer), or a list of 0/1 per layer written as a
    Python list expression such as ``[1,1,0]`` or ``([1]*3+[0])*2``. Evaluated by walking its
    syntax tree (lists, whole numbers, + and *), never by eval()."""
    import ast   # only for the list form

    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            return [value(e) for e in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Mult) and isinstance(left, list) and isinstance(right, int) and right <= 4096:
                return left * right
            if isinstance(node.op, ast.Add) and isinstance(left, list) and isinstance(right, list):
                return left + right
        raise ValueError
    try:
        parsed = value(ast.parse(text.strip(), mode="eval").body) if len(text) <= 1000 else None
    except (SyntaxError, ValueError, RecursionError):
        parsed = None
    if isinstance(parsed, int) and 1 <= parsed <= _MAX:
        return parsed
    if isinstance(parsed, list) and len(parsed) <= 4096 and parsed and all(v in (0, 1) for v in parsed):
        return parsed
    raise argparse.ArgumentTypeError(f"expected N (every N-th layer) or a list of 0/1 per layer such as "
                                     f"[1,1,0] or ([1]*3+[0])*2; got {text[:40]!r}")
