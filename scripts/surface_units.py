"""The launch units of a Megatron-LM checkout, as command lines: the first half of
scripts/megatron_surface.py (its docstring says what a unit is).

A script's flags are what bash would pass: the variables it assigns (strings, arrays, ``+=``,
``${X:-default}``) are expanded as a shell expands them, arrays split again where bash splits
them. A CI case's MODEL_ARGS become the words CI's launcher passes. Nothing runs here, and
nothing of minitron is imported.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ENTRY = re.compile(r"pretrain_(gpt|hybrid|mamba)\.py")


# --- shell ----------------------------------------------------------------------------------------
def _logical_lines(text: str) -> list[str]:
    """Continuation lines joined, comments dropped, a multi-line array assignment on one line."""
    text = re.sub(r"\\\n", " ", text)
    lines, pending = [], ""
    for raw in text.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()   # a comment starts a word
        if not line:
            continue
        pending = f"{pending} {line}" if pending else line
        if pending.count("(") > pending.count(")"):       # an array still open
            continue
        if len(re.findall(r'(?<!\\)"', pending)) % 2:     # a double-quoted string still open
            continue
        lines.append(pending)
        pending = ""
    return lines + ([pending] if pending else [])


def _expand(text: str, env: dict) -> str:
    """Expand $X, ${X}, ${X:-d}, ${A[@]} and $(( )): "${A[@]}" gives one word per element, an
    unquoted ${A[@]} splits the elements again at their spaces (as bash does)."""
    def arith(m):
        try:
            return str(int(eval(_expand(m[1], env), {"__builtins__": {}})))   # integers only, no names
        except Exception:
            return "1"
    text = re.sub(r"\$\(\((.*?)\)\)", arith, text)

    def quoted_array(m):   # "${A[@]}": one word per element, whatever spaces an element holds
        value = env.get(m[1])
        return " ".join(shlex.quote(v) for v in value) if isinstance(value, list) else shlex.quote(value or "")
    text = re.sub(r'"\$\{(\w+)\[[@*]\]\}"', quoted_array, text)

    def var(m):
        name, default = m["name"] or m["plain"], m["default"]
        value = env.get(name)
        if m["array"] is not None:   # unquoted ${A[@]}: the elements, split again at their spaces
            return " ".join(value) if isinstance(value, list) else (value or "")
        if isinstance(value, list):
            value = value[0] if value else ""
        if value in (None, ""):
            return default if default is not None else ("" if name.startswith("_") else "1")
        return value
    return re.sub(r"\$\{(?P<name>\w+)(?P<array>\[[@*]\])?(?::-(?P<default>[^}]*))?\}|\$(?P<plain>\w+)", var, text)


def run_shell(text: str) -> tuple[dict, list[str]]:
    """The variables a script assigns, in order, and its logical lines (expanded later)."""
    env: dict = {}
    lines = _logical_lines(text)
    for line in lines:
        m = re.match(r"^(?:export\s+|local\s+|declare\s+(?:-a\s+)?)?(\w+)(\+?)=(.*)$", line)
        if not m:
            continue
        name, append, value = m[1], m[2], m[3].strip()
        if value.startswith("("):
            words = shlex.split(_expand(value[1:value.rfind(")")], env))
            env[name] = (env.get(name) if isinstance(env.get(name), list) and append else []) + words
        else:
            try:
                words = shlex.split(_expand(value, env))
            except ValueError:
                continue
            joined = " ".join(shlex.quote(w) if " " in w and not w.strip().startswith("-") else w for w in words)
            env[name] = (str(env.get(name, "")) + joined) if append else joined
    return env, lines


def script_flags(text: str) -> list[str] | None:
    """The words after pretrain_*.py on the line that runs it (the script's name may come from a
    variable), or None if no line does. Of several such lines, the one that passes the most."""
    env, lines = run_shell(text)
    best = None
    for line in lines:
        if re.match(r"^(echo|if|elif|then|\[|test)\b", line.lstrip()):
            continue   # a message or a test, not the command
        assigned = re.match(r"^(?:export\s+)?\w+\+?=(.*)$", line.strip())
        if assigned:   # a command kept in a variable (CMD="... pretrain_gpt.py ..."): its text
            line = assigned[1].strip().strip('"')
        expanded = _expand(line, env)
        try:
            words = shlex.split(expanded)
        except ValueError:
            words = expanded.split()
        start = next((i for i, w in enumerate(words) if ENTRY.search(w)), None)
        if start is None:
            continue
        out = []
        for w in words[start + 1:]:
            if w in ("|", "||", "&&", ";", "&") or re.match(r"^\d?>", w) or w.startswith(">"):
                break
            out.append(w)
        if best is None or len(out) > len(best):
            best = out
    return best


# --- units ----------------------------------------------------------------------------------------
def yaml_flags(model_args: dict) -> list[str]:
    """A CI case's MODEL_ARGS as a command line: true -> the flag, false -> nothing."""
    out = []
    for key, value in model_args.items():
        if value is True or value is None:
            out.append(key)
        elif value is False:
            continue
        elif isinstance(value, list) or re.fullmatch(r"\[[^]]*\]", str(value).strip()):
            # a YAML list (CI's launcher passes its items as the flag's words); "[a, b]" or "[a b]" as a string too
            items = value if isinstance(value, list) else re.split(r"[,\s]+", str(value).strip()[1:-1])
            out += [key, *(str(v).strip() for v in items if str(v).strip())]
        else:   # one word, spaces and all: CI's _run_training.sh passes KEY="VALUE" as one argument
            out += [key, str(value)]
    return out


def find_units(root: Path) -> list[dict]:
    import yaml

    units = []
    for path in sorted(root.glob("examples/**/*.sh")):
        text = path.read_text(errors="replace")
        conf = "post_training/modelopt/conf" in str(path)
        if "post_training/modelopt" in str(path) and not conf:
            continue   # the wrappers that source a conf/ model (its MODEL_ARGS are the unit)
        if conf and path.name != "arguments.sh":
            env, _ = run_shell(text)
            if "MODEL_ARGS" in env:
                units.append({"kind": "model", "path": path, "argv": shlex.split(str(env["MODEL_ARGS"])), "env": {}})
        elif not conf and ENTRY.search(text):
            argv = script_flags(text)
            # A wrapper whose command line is one variable its callers set (sc21/SRUN.sh runs
            # pretrain_gpt.py ${MEGATRON_PARAMS}) names no flag itself: not a launch unit.
            if argv is not None and any(w.startswith("--") for w in argv):
                hybrid = re.search(r"pretrain_(hybrid|mamba)\.py", text) is not None
                units.append({"kind": "script", "path": path, "argv": argv, "env": {}, "hybrid": hybrid})
    for path in sorted(root.glob("tests/functional_tests/test_cases/**/model_config.yaml")):
        try:
            config = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError:
            continue
        args = config.get("MODEL_ARGS") or {}
        family = path.relative_to(root / "tests/functional_tests/test_cases").parts[0]
        if (not args or not all(str(k).startswith("--") for k in args) or config.get("MODE") == "inference"
                or family in ("bert", "t5", "multimodal-llava", "mimo")):
            continue
        env = {str(k): str(v) for k, v in (config.get("ENV_VARS") or {}).items()}
        units.append({"kind": "ci", "path": path, "argv": yaml_flags(args), "env": env,
                      "hybrid": family == "hybrid"})
    for unit in units:
        unit["hybrid"] = unit.get("hybrid") or "--hybrid-layer-pattern" in unit["argv"] or \
            "--hybrid-override-pattern" in unit["argv"]
    return units
