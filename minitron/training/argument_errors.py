"""How validate_args refuses: ArgumentError and require().

Their own module, below argument_groups.py: the group modules it imports (ci, ckpt, fsdp,
hybrid, launch, overlap, pipeline split) refuse with these too, and importing them from
argument_groups would make a cycle. argument_groups re-exports both for existing importers.
"""

from __future__ import annotations


class ArgumentError(ValueError):
    """A bad or inconsistent argument; the message is one line a user can act on."""


def require(condition: bool, message: str) -> None:
    """validate_args' one way to refuse: ArgumentError with ``message`` unless ``condition``."""
    if not condition:
        raise ArgumentError(message)
