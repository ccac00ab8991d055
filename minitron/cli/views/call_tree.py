"""One rank's calls as a tree that stays readable however big the run.

A training iteration of a small pipeline makes hundreds of calls per rank, and
initialize_model_parallel alone makes ~150 new_group calls on 16 ranks. Four foldings keep the
tree to what a reader can take in:

* Repeated siblings merge into one line: the eight forward_step calls of one schedule become
  ``forward_step ×8  41.0 ms, 5.1 ms each``, and their children merge the same way, so the line
  below it reads ``GPTModel.forward ×8``. The executed order is what the schedule view shows.
* new_group calls fold per kind, the group this rank kept in bold:
  ``new_group ×8 TENSOR_MODEL_PARALLEL_GROUP [0,1] [2,3] …``.
* ``focus`` keeps only the subtrees of the calls it names, their ancestors folded into one
  line: ``pretrain › train › train_step ›``, then what happened inside.
* Names lose leading packages only as far as the line needs (``schedules.forward_step`` then
  ``forward_step``), so a wide terminal shows what the files hold and 80 columns stay legible.

A call whose caller never returned (a rank that died or was stopped mid-call writes no record
for the open calls) is shown at the top, marked, rather than lost.
"""

from __future__ import annotations

import difflib
from fnmatch import fnmatchcase

from rich.text import Text
from rich.tree import Tree

from minitron.cli.views.words import duration, fitted_name, plural, rank_ranges, short_name
from minitron.core.rank_generator import DESC_TO_KEY
from minitron.trace.schema import NEW_GROUP, PLAYED

GUIDE = 4  # columns that rich's Tree indents each level by


class FocusError(ValueError):
    """--focus names no call of the rank shown."""


class Calls:
    """One rank's records, indexed by caller."""

    def __init__(self, records: list[dict]):
        self.by_id = {r["id"]: r for r in records}
        self.children: dict = {}
        self.orphans = set()
        for r in records:
            parent = r["parent"]
            if parent is not None and parent not in self.by_id:
                self.orphans.add(r["id"])
                parent = None
            self.children.setdefault(parent, []).append(r)

    def kids(self, group: list[dict]) -> list[dict]:
        return [c for call in group for c in self.children.get(call["id"], [])]

    def below(self, call_id) -> int:
        """How many calls ran inside this one, at any depth."""
        count, stack = 0, [call_id]
        while stack:   # a walk of its own, not a recursion: a rank's tree may be deep
            kids = self.children.get(stack.pop(), [])
            count += len(kids)
            stack.extend(c["id"] for c in kids)
        return count

    def path(self, record: dict) -> list[dict]:
        """The callers of ``record``, outermost first."""
        chain, parent = [], record["parent"]
        while parent is not None and parent in self.by_id:
            chain.append(self.by_id[parent])
            parent = self.by_id[parent]["parent"]
        return chain[::-1]


def merge(records: list[dict]) -> list[list[dict]]:
    """Siblings grouped by name (and, for torch.distributed calls, by group), in first-seen order."""
    groups: dict = {}
    for r in records:
        group = r["args"].get("group_desc") if r["name"] == NEW_GROUP else r["args"].get("group")
        # a traced step of one's own may take a "group" that is a list of ranks: keyed by its text
        key = (r["name"], group if isinstance(group, (str, int, float, type(None))) else repr(group))
        groups.setdefault(key, []).append(r)
    return list(groups.values())


def _args_segments(record: dict) -> list[tuple[str, str]]:
    """What a call's line says after its name, as (text, style) pieces, most telling first."""
    name, args = record["name"], record["args"]
    if name == "torch.distributed.init_process_group":
        world = [(f" world_size={args['world_size']}", "dim")] if isinstance(args.get("world_size"), int) else []
        return [(f"  backend={args.get('backend')}", "dim")] + world
    if name == PLAYED:  # the fake launcher's note: what this trace holds, and what it only counted
        played = "all" if args["ranks"] == "all" else rank_ranges(args["ranks"])
        skipped = sum(args.get("unrecorded_new_groups", {}).values())
        return [(f"  world {args['world_size']:,}, played {played}", "dim"),
                (f"; {skipped:,} others' new_group calls counted only", "dim")]
    if "group" not in args or not name.startswith("torch.distributed."):
        return []
    pieces = [(f"  {args['group']}", "magenta"), (f" {rank_ranges(args.get('ranks'))}", "magenta")]
    if "ops" in args:  # batch_isend_irecv: which way each message went, and to whom
        ops = " ".join(("send→" if op["op"] == "isend" else "recv←") + str(op["peer"]) for op in args["ops"])
        pieces.append((f" {ops}", "magenta"))
    if "shape" in args:
        pieces.append((f" {args['shape']}", "dim"))
    return pieces


def _narrower(pieces: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """The arguments, then shorter versions of them for a narrow line: without the shapes and
    ops; with the group's short key (the group table's column: tp, dp, ...); without ranks."""
    more = (" …", "dim")
    options = [pieces] + [pieces[:n] + [more] for n in range(len(pieces) - 1, 1, -1)]
    group = pieces[0][0].strip() if pieces else ""
    if group in DESC_TO_KEY:
        key = (f"  {DESC_TO_KEY[group]}", pieces[0][1])
        options += [[key] + pieces[1:2] + ([more] if len(pieces) > 2 else []), [key, more]]
    elif len(pieces) > 1:
        options.append(pieces[:1] + [more])
    return options


def _time_room(times: str, count: int) -> int:
    """The width a line keeps for its time: room for any time under ten seconds, so that what a
    line shortens does not change from run to run with the digits of its duration."""
    widest = f"  {duration(9_999_900)}" + (f", {duration(9_999_900)} each" if count > 1 else "")
    return max(len(times), len(widest))


def _label(group: list[dict], room: int, orphan: bool) -> Text:
    first, count = group[0], len(group)
    total = sum(c["end_us"] - c["start_us"] for c in group)
    times = f"  {duration(total)}" + (f", {duration(total / count)} each" if count > 1 else "")
    times_x = f" ×{count}" if count > 1 else ""
    # Arguments only where every call agrees: eight all_reduces on one group with different
    # shapes still name the group.
    each = [_args_segments(c) for c in group]
    agreed = [p for i, p in enumerate(each[0]) if all(len(e) == len(each[0]) and e[i] == p for e in each)]
    # Shorten the name first, down to Class.method or function; then the arguments; never the time.
    for pieces in _narrower(agreed):
        rest = len(times_x) + sum(len(t) for t, _ in pieces) + _time_room(times, count)
        name = fitted_name(first["name"], room - rest)
        if len(name) + rest <= room:
            break
    else:  # even the bare function name is too long this deep: it gives way, not the time
        actual = len(times_x) + sum(len(t) for t, _ in pieces) + len(times)
        name = name[:max(room - actual - 1, 8)] + "…" if len(name) + actual > room else name
    text = Text(name, style="bold cyan" if first["name"].startswith("torch.") else "bold")
    text.append(times_x, style="bold")
    for piece, style in pieces:
        text.append(piece, style=style)
    text.append(times, style="green")
    error = next((c["error"] for c in group if c.get("error")), None)
    if error:
        text.append(f"  ✗ {error}", style="red")
    if orphan:
        text.append("  (its caller never returned)", style="yellow")
    return text


def _fit_tokens(tokens: list[str], member: int | None, room: int) -> list:
    """As many rank lists as fit in ``room``, always including this rank's own (index
    ``member``); the rest become '…'. Items are indices into ``tokens`` or '…'."""
    def width(items):
        return sum(1 + (1 if i == "…" else len(tokens[i])) for i in items)
    everything = list(range(len(tokens)))
    if width(everything) <= room:
        return everything
    for k in range(len(tokens) - 1, -1, -1):
        items = list(range(k))
        if member is not None and member >= k:
            items += (["…"] if member > k else []) + [member] + (["…"] if member < len(tokens) - 1 else [])
        else:
            items.append("…")
        if width(items) <= room:
            return items
    if member is not None:  # only this rank's list, cut short at a comma: "[0-7,32-39,…]"
        more = len(tokens) > 1
        parts = tokens[member][1:-1].split(",")
        for n in range(len(parts) - 1, 0, -1):
            clipped = "[" + ",".join(parts[:n]) + ",…]"
            if 1 + len(clipped) + (2 if more else 0) <= room:
                tokens[member] = clipped
                return [member] + (["…"] if more else [])
    return ["…"]  # not even that fits: the group table shows this rank's groups


def _elide_desc(desc: str, room: int) -> str:
    """A group's name in ``room`` characters. The words every name shares give way first (GROUP,
    then PARALLEL, AND, MODEL), each marked by "…", so the words that tell Megatron's groups
    apart stay: TENSOR_AND_DATA_…_WITH_CP beside TENSOR_AND_DATA_…; only then is the end cut."""
    words = desc.split("_")
    for common in ("GROUP", "PARALLEL", "AND", "MODEL"):
        if len(desc) <= room:
            return desc
        words = ["…" if w == common else w for w in words]
        words = [w for k, w in enumerate(words) if not (w == "…" and k and words[k - 1] == "…")]
        desc = "_".join(words)
    return desc if len(desc) <= room else desc[:max(room - 1, 6)] + "…"


def _new_group_line(rank: int, group: list[dict], room: int, counted: dict[str, int]) -> Text:
    """``counted``: the calls of each description a fake play answered without recording them
    (launcher/fake.py); they count in ×N, as they would in a real run, and are said to be counted."""
    desc = group[0]["args"].get("group_desc")
    tokens = [rank_ranges(c["args"]["ranks"]) for c in group]
    member = next((i for i, c in enumerate(group)
                   if isinstance(c["args"]["ranks"], list) and rank in c["args"]["ranks"]), None)
    times = f"  {duration(sum(c['end_us'] - c['start_us'] for c in group))}"
    others = counted.get(str(desc), 0)
    head = f"new_group ×{len(group) + others:,} "
    tail = f" +{others:,} counted" if others else ""
    desc = str(desc)
    # A deep line with a long name (TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP) keeps its time on the
    # line: the name gives way before the line would wrap.
    desc = _elide_desc(desc, room - len(head) - len(tail) - _time_room(times, 1) - 2)
    text = Text(head, style="bold cyan")
    text.append(desc, style="magenta")
    for item in _fit_tokens(tokens, member, room - len(head) - len(desc) - len(tail) - _time_room(times, 1)):
        if item == "…":
            text.append(" …", style="dim")
        else:
            text.append(" " + tokens[item], style="bold yellow" if item == member else "dim")
    text.append(tail, style="dim")
    text.append(times, style="green")
    return text


def _path_line(names: list[str], room: int) -> Text:
    """``pretrain › train › train_step ›``; middle names give way to '…' when it is too wide."""
    shown, drop = names, 0
    while len(" › ".join(shown)) + 2 > room and drop < len(names) - 2:
        drop += 1
        shown = [names[0], "…"] + names[1 + drop:]
    return Text(" › ".join(shown) + " ›", style="dim")


def _matches(name: str, pattern: str) -> bool:
    """NAME matches a call if it matches the call's name or any dotted tail of it:
    train_step, training.train_step, '*forward*'."""
    parts = name.split(".")
    return any(fnmatchcase(".".join(parts[i:]), pattern) for i in range(len(parts)))


def focused(calls: Calls, records: list[dict], pattern: str, rank: int) -> list[tuple[list[str], list[dict]]]:
    """The outermost calls matching ``pattern``, grouped by their chain of callers."""
    hits = [r for r in records if _matches(r["name"], pattern)]
    if not hits:
        names = list(dict.fromkeys(short_name(r["name"]) for r in records))  # outermost first
        close = difflib.get_close_matches(pattern, names, n=3, cutoff=0.6)
        hint = (f"did you mean {' or '.join(close)}?" if close else
                f"give a function name ({', '.join(names[:3]) or 'pretrain'}, …) or a pattern like '*forward*'")
        raise FocusError(f"--focus {pattern!r} matches no call of rank {rank}; {hint}")
    hit_ids = {r["id"] for r in hits}
    by_path: dict = {}
    for r in hits:
        callers = calls.path(r)
        if any(c["id"] in hit_ids for c in callers):
            continue  # inside an outer match, which shows it already
        by_path.setdefault(tuple(short_name(c["name"]) for c in callers), []).append(r)
    return [(list(path), found) for path, found in by_path.items()]


def call_tree(records: list[dict], rank: int, max_depth: int | None = None, focus: str | None = None,
              width: int = 80) -> Tree:
    """``rank``'s calls as a tree (see the module docstring). Below ``max_depth`` levels a line
    shows only how many calls ran inside it; with ``focus`` the levels count from the match."""
    calls = Calls(records)
    root = Tree(Text(f"rank {rank}", style="bold underline"))
    counted = next((r["args"].get("unrecorded_new_groups", {}) for r in reversed(records) if r["name"] == PLAYED), {})

    def add(node: Tree, siblings: list[dict], level: int, indent: int) -> None:
        room = width - GUIDE * indent
        for group in merge(siblings):
            orphan = any(c["id"] in calls.orphans for c in group)
            if group[0]["name"] == NEW_GROUP:
                line = node.add(_new_group_line(rank, group, room, counted))
                if orphan:
                    line.label.append("  (its caller never returned)", style="yellow")
                continue
            child = node.add(_label(group, room, orphan))
            kids = calls.kids(group)
            if not kids:
                continue
            if max_depth is not None and level >= max_depth:
                child.add(Text(f"… {plural(sum(calls.below(c['id']) for c in group), 'call')} below", style="dim"))
            else:
                add(child, kids, level + 1, indent + 1)

    if focus is None:
        add(root, calls.children.get(None, []), 1, 1)
        return root
    for path, found in focused(calls, records, focus, rank):
        if path:
            add(root.add(_path_line(path, width - GUIDE)), found, 1, 2)
        else:
            add(root, found, 1, 1)
    return root
