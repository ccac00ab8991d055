"""How a page's run lines are found, and how a command's output becomes Markdown (for
run_commands.py, which finds the commands, and command_run.py, which runs them).

The output goes in a ```text block (indented like the comment, so it works inside admonitions
and tabs) marked ``.no-copy``: output is read, not pasted into a terminal, so no copy button
sits on its first line. A run line inside a fenced code block is left alone, so a page can show
the syntax.

A ``figure`` line runs its command the same way; what the command prints must be one SVG
document (well-formed XML, checked here), which goes into the page as it is, inside a
``<figure class="minitron-figure">``: the pictures are drawn by minitron/cli/views/svg*.py from
the same runs as the text around them, at build time.

WIDTH is the column count the commands are told (COLUMNS) and the longest line an output block
keeps: what a code block of a page holds at a laptop's width, 1280 px (the sizes are set in
docs/stylesheets/output.css and measured by tests/test_pages_browser.py). A longer line is
folded at spaces, never set in a smaller font: small print is what a reader squints at.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree

from mkdocs.exceptions import PluginError

RUN_LINE = re.compile(r"^(?P<indent>[ \t]*)<!--\s*(?P<kind>run|figure):\s*(?P<command>.*?)\s*-->[ \t]*$")
FENCE_OPEN = re.compile(r"^[ \t]*(?P<fence>`{3,}|~{3,})")
# CSI sequences (colours, cursor moves) and OSC sequences (hyperlinks, titles).
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
WIDTH = 120  # characters: a code block of a page at 1280 px (see the module docstring)
# A duration as minitron prints what it timed ("524.5 ms", "0.75 s"): the one thing two builds
# of the same commit print differently. An output holding one says so under it, so that a page
# tells measurements of this build from everything else on it. (Whole numbers with a unit are
# settings, "within 2 s", and are the same in every build.)
MEASURED = re.compile(r"\b\d+\.\d+ ?(?:µs|ms|s)\b")
MEASURED_NOTE = "*Times in the output above are what this build measured; another build's differ.*"


def clean(text: str, places: dict[str, str] | None = None) -> str:
    """Strip colour codes and trailing blanks, and show ``places`` (a path of the build machine
    -> what the page says instead); keep the layout the command chose."""
    text = ANSI.sub("", text).replace("\r\n", "\n")
    for path, shown in (places or {}).items():
        text = text.replace(path, shown)
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def fenced(text: str, indent: str) -> list[str]:
    # A fence longer than any run of backticks in the output cannot be closed by it.
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    body = [part for line in text.split("\n") for part in fold(line)] if text else ["(no output)"]
    block = ([f"{indent}{fence}{{.text .no-copy}}"] + [f"{indent}{line}" if line else "" for line in body]
             + [indent + fence])
    return block + (["", indent + MEASURED_NOTE] if MEASURED.search(text) else [])


def fold(line: str) -> list[str]:
    """A line longer than WIDTH as lines of at most WIDTH, broken at spaces where it can be
    (as `fold -s` would), each continuation indented under the line's own first word."""
    if len(line) <= WIDTH:
        return [line]
    indent = " " * min(len(line) - len(line.lstrip(" ")) + 2, WIDTH // 2)
    out, rest = [], line
    while len(rest) > WIDTH:
        cut = rest.rfind(" ", len(indent) + 1 if out else 1, WIDTH + 1)
        cut = cut if cut > 0 else WIDTH
        out.append(rest[:cut].rstrip())
        rest = indent + rest[cut:].lstrip(" ")
    return out + [rest]


def figure(text: str, indent: str, page: str, command: str) -> list[str]:
    """An SVG document as raw HTML in the page: checked to be well-formed, without blank lines
    (which would end Markdown's raw HTML block)."""
    svg = re.sub(r"^\s*<\?xml[^>]*\?>\s*", "", text)
    try:
        root = ElementTree.fromstring(svg)
    except ElementTree.ParseError as exc:
        raise PluginError(f"{page}: `<!-- figure: {command} -->` did not print well-formed SVG ({exc})") from None
    if root.tag not in ("svg", "{http://www.w3.org/2000/svg}svg"):
        raise PluginError(f"{page}: `<!-- figure: {command} -->` printed <{root.tag}>, not an <svg> picture")
    lines = [line for line in svg.split("\n") if line.strip()]
    return [f'{indent}<figure class="minitron-figure" markdown="0">'] + [indent + line for line in lines] \
        + [f"{indent}</figure>"]


def scan(markdown: str):
    """Yield (line, run-line match or None), telling apart lines inside fenced code blocks."""
    open_fence: str | None = None
    for line in markdown.split("\n"):
        fence = FENCE_OPEN.match(line)
        if open_fence is not None:
            if fence and fence["fence"][0] == open_fence[0] and len(fence["fence"]) >= len(open_fence) \
                    and not line.strip()[len(fence["fence"]):].strip():
                open_fence = None
            yield line, None
        elif fence:
            open_fence = fence["fence"]
            yield line, None
        else:
            yield line, RUN_LINE.match(line)


def run_commands(markdown: str) -> list[str]:
    """The commands of a page's run lines, in page order."""
    return [m["command"] for _, m in scan(markdown) if m and m["command"]]
