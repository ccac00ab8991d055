"""Every tensor the training step, the optimizers and the checkpoints make says where it lives.

On CPU ranks a tensor made without ``device=`` lands where it should by luck: the CPU is the
default device and the only one. On a GPU rank the same line makes a CPU tensor, and the first
collective or product that meets a CUDA tensor fails ("Expected all tensors to be on the same
device") - or worse, works through a slow host copy every step. No CPU-only test run can see
that, so the rule is read off the source instead:

In minitron/core, minitron/runtime, minitron/training and minitron/ops, a call of one of
torch's tensor factories passes ``device=`` (or ``**kwargs`` that carry it), or its first line
ends with a ``# host: <why>`` comment for a tensor that belongs in host memory on purpose (a
dataset's index, a file's bytes, a master weight drawn on the CPU). Making a tensor like one at
hand (``torch.zeros_like``, ``x.new_zeros``) needs neither: it follows its model.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "minitron"
CHECKED = ("core", "runtime", "training", "ops")
FACTORIES = {"zeros", "ones", "empty", "full", "tensor", "as_tensor", "arange", "linspace", "logspace",
             "eye", "rand", "randn", "randint", "randperm", "empty_strided", "scalar_tensor"}


def _unplaced_factories(path: Path) -> list[str]:
    """'file:line: source' for each factory call with no device= and no '# host:' reason."""
    text = path.read_text()
    lines = text.splitlines()
    found = []
    for node in ast.walk(ast.parse(text)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in FACTORIES and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "torch"):
            continue
        if any(k.arg == "device" or k.arg is None for k in node.keywords):
            continue
        line = lines[node.lineno - 1]
        if "# host:" in line and line.split("# host:", 1)[1].strip():
            continue
        found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {line.strip()}")
    return found


def test_every_tensor_factory_says_where_its_tensor_lives():
    unplaced = [hit for room in CHECKED for path in sorted((ROOT / room).rglob("*.py"))
                for hit in _unplaced_factories(path)]
    assert not unplaced, ("tensors made without device= (on a GPU rank they land on the CPU); pass "
                          "device=, make them like a tensor at hand, or end the line with "
                          "'# host: <why>':\n" + "\n".join(unplaced))


def test_the_rule_sees_a_factory_without_a_device(tmp_path):
    """The reader above is not vacuous: it flags what it should and passes what it should."""
    sample = tmp_path / "sample.py"
    sample.write_text("import torch\n"
                      "a = torch.zeros(3)\n"
                      "b = torch.zeros(3, device=x.device)\n"
                      "c = torch.tensor([1], **where)\n"
                      "d = torch.arange(4)  # host: an index for numpy\n"
                      "e = torch.empty(2)  # host:\n"
                      "f = torch.zeros_like(a)\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        hits = _unplaced_factories(sample)
    finally:
        ROOT = saved
    assert [h.split(":")[1] for h in hits] == ["2", "6"]
