"""How the views write ranks, counts and call names in little room.

* Rank lists as ranges: ``[0-127]`` says "the whole 128-rank world" in seven characters, and
  ``[0,2,4-7]`` keeps the order Megatron gave the group (a rank's place in that list is its
  rank inside the group), so only increasing runs are folded.
* Counts with the right noun: "1 process", "2 processes".
* Call names as short as the line needs: the files keep full qualified names; a tree at 80
  columns drops leading packages one at a time, down to ``Class.method`` or ``function``
  (``torch.distributed.X`` becomes ``dist.X``, the way torch's own docs write it).
"""

from __future__ import annotations


def rank_ranges(ranks) -> str:
    """``[0,2,4-7]``: increasing runs of three or more ranks as first-last. A value that is not
    a list ("all", "128 ranks") is written as it is."""
    if not isinstance(ranks, (list, tuple)):
        return str(ranks)
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{ranks[i]}-{ranks[j]}")
        else:
            parts.extend(str(r) for r in ranks[i:j + 1])
        i = j + 1
    return "[" + ",".join(parts) + "]"


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``plural(1, "process", "processes")`` -> "1 process"; the plural defaults to noun + s."""
    return f"{count} {noun if count == 1 else (nouns or noun + 's')}"


def name_forms(name: str) -> list[str]:
    """A qualified call name, longest form first, each dropping one more leading package."""
    if name.startswith("torch.distributed."):
        return [name, "dist." + name.removeprefix("torch.distributed.")]
    parts = name.removeprefix("minitron.").split(".")
    # Keep Class.method together: a reader needs the class to know which forward it is.
    keep = 2 if len(parts) >= 2 and parts[-2].lstrip("_")[:1].isupper() else 1
    # ...and a script's entry with its script: "__main__" alone names no program.
    keep = 2 if len(parts) >= 2 and parts[-1] == "__main__" else keep
    return [".".join(parts[i:]) for i in range(len(parts) - keep + 1)]


def fitted_name(name: str, room: int) -> str:
    """The longest form of ``name`` no wider than ``room`` characters (else the shortest)."""
    forms = name_forms(name)
    return next((form for form in forms if len(form) <= room), forms[-1])


def short_name(name: str) -> str:
    return name_forms(name)[-1]


def duration(us: float) -> str:
    """Microseconds as "12.3 ms", or "4.21 s" from ten seconds on."""
    return f"{us / 1e6:.2f} s" if us >= 1e7 else f"{us / 1000:.1f} ms"


def human(n: float) -> str:
    """Bytes in binary units, three significant figures: 1.50 GiB, 512 B."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            value = n / size
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{int(n)} B"
