"""scripts/bench_gpu.py end to end on the CPU (--cpu-smoke): every side runs, every figure and
ratio is printed as a number, and they agree with one another and with the --json file."""

from __future__ import annotations

import json
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "bench_gpu.py"
NUMBER = r"[0-9.]+(?:e[+-]?[0-9]+)?"
ROW = re.compile(rf"^(minitron|plain eager|plain compiled) +({NUMBER}) +({NUMBER}) +({NUMBER}) +(n/a|{NUMBER}%) "
                 rf"+(n/a|{NUMBER})$")


def bench(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=240)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """The whole benchmark at a tiny size: three sides in fresh interpreters, 10-17 s of the
    README's test run, so the tests that read it run in .ci/run's stress stage."""
    out = tmp_path_factory.mktemp("bench") / "figures.json"
    done = bench("--cpu-smoke", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, json.loads(out.read_text())


@pytest.mark.stress
def test_every_side_prints_its_figures(smoke):
    stdout, _ = smoke
    rows = {m[1]: m.groups()[1:] for m in map(ROW.match, stdout.splitlines()) if m}
    assert set(rows) == {"minitron", "plain eager", "plain compiled"}
    tokens_per_iteration = 4 * 64   # the smoke's global batch x sequence
    for name, (ms, tokens, tflops, mfu, memory) in rows.items():
        assert float(ms) > 0 and float(tflops) > 0
        # tokens/s and ms/iteration are one measurement, printed twice
        assert float(tokens) * float(ms) / 1000 == pytest.approx(tokens_per_iteration, rel=0.01), name
        assert (mfu, memory) == ("n/a", "n/a")   # no GPU: no peak to divide by, no CUDA allocator


@pytest.mark.stress
def test_the_ratios_are_the_rows_tokens_per_second(smoke):
    stdout, figures = smoke
    ratios = dict(re.findall(rf"^ratio (minitron/\w+): ({NUMBER})x \(tokens/s\)$", stdout, re.M))
    tokens = {name: r["tokens_per_s"] for name, r in figures["results"].items()}
    assert float(ratios["minitron/eager"]) == pytest.approx(tokens["minitron"] / tokens["plain eager"], abs=1e-3)
    assert float(ratios["minitron/compiled"]) == pytest.approx(tokens["minitron"] / tokens["plain compiled"],
                                                               abs=1e-3)


@pytest.mark.stress
def test_one_flop_count_for_all_sides_and_the_goals_stated(smoke):
    stdout, figures = smoke
    flops = figures["flops_per_iteration"]
    for r in figures["results"].values():
        assert r["tflops_per_gpu"] == pytest.approx(flops / (r["ms_per_iteration"] / 1000) / 1e12)
    assert "goal: minitron/eager >= 1.0x and MFU >= 45% on one H100" in stdout
    assert stdout.rstrip().endswith("goals not checked: no GPU")
    assert figures["fast_flags"] == [] and figures["fast"] is False


@pytest.mark.parametrize("argv, words", [
    (["--cpu-smoke", "--iters", "2"], ["--iters 2", "at least 4"]),
    (["--cpu-smoke", "--global-batch-size", "5"], ["--global-batch-size 5", "--micro-batch-size 2"]),
    (["--cpu-smok"], ["--cpu-smok"]),
])
def test_bad_flags_get_one_line(argv, words):
    done = bench(*argv)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and all(w in done.stderr for w in words)


def test_without_a_gpu_it_says_so_and_exits_2(capsys, monkeypatch):
    if Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi"):
        pytest.skip("an NVIDIA driver is here: the script would run the whole benchmark")
    # Its main() in this process, which has torch imported already: a fresh interpreter spent
    # ~1.7 s of CPU importing torch only to find no GPU. The script's last line hands main()'s
    # return value to sys.exit, so it is the exit code.
    monkeypatch.syspath_prepend(str(SCRIPT.parent))   # as for a script: its own folder first
    assert runpy.run_path(str(SCRIPT))["main"]([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "--cpu-smoke" in err
    assert SCRIPT.read_text().rstrip().endswith("sys.exit(main())")


RUNS = sorted((ROOT / "docs" / "gpu-runs").glob("*.json"))
GEMM = [p for p in RUNS if p.name.endswith("-gemm.json")]            # scripts/check_fp8_gpu.py --json
FP8 = [p for p in RUNS if p not in GEMM and "fp8_flags" in json.loads(p.read_text())]   # bench_gpu.py --fp8
RECORDED = [p for p in RUNS if p not in GEMM and p not in FP8]      # bench_gpu.py's three sides


def test_the_recorded_gpu_runs_print_as_recorded_and_the_page_quotes_them():
    """docs/gpu.md shows the H100 runs through --show, and its prose quotes a few figures: both
    must be the recorded files' numbers (rounded as printed), so neither can drift from the run."""
    assert RECORDED, "docs/gpu-runs/ holds the recorded runs the GPU page shows"
    done = bench("--show", *map(str, RECORDED))
    assert done.returncode == 0, done.stderr
    rows = [m.groups() for m in map(ROW.match, done.stdout.splitlines()) if m]
    runs = [json.loads(p.read_text()) for p in RECORDED]
    assert len(rows) == 3 * len(runs)
    for (name, ms, tokens, *_), (rec, side) in zip(rows, [(r, s) for r in runs for s in r["results"]]):
        assert name == side and float(ms) == pytest.approx(rec["results"][side]["ms_per_iteration"], abs=0.05)
        assert float(tokens) == pytest.approx(rec["results"][side]["tokens_per_s"], abs=0.05)
    page = (ROOT / "docs" / "gpu.md").read_text()
    for rec in runs:
        assert f"{rec['ratios']['minitron/eager']:.2f}×" in page
        assert f"{rec['results']['minitron']['mfu']:.1%}".replace("%", "") in page


def test_the_recorded_fp8_runs_print_as_recorded_and_the_page_quotes_them():
    """The fp8 runs (bf16 against fp8, and the GEMM check): --show prints each file's figures,
    and the ratios and timings docs/gpu.md quotes are the files' own, rounded as quoted."""
    assert FP8 and GEMM, "docs/gpu-runs/ holds the fp8 runs the GPU page shows"
    page = (ROOT / "docs" / "gpu.md").read_text()
    chapter = (ROOT / "walkthrough" / "21-fp8.md").read_text()   # quotes the newest fp8 run too
    for path in FP8:
        rec = json.loads(path.read_text())
        done = bench("--show", str(path))
        assert done.returncode == 0, done.stderr
        for side, r in rec["results"].items():
            assert re.search(rf"^{side} +{r['ms_per_iteration']:.1f} +{r['tokens_per_s']:.1f} ", done.stdout, re.M)
        assert f"{rec['ratios']['fp8/bf16']:.2f}×" in page, path.name
    fused = json.loads((ROOT / "docs" / "gpu-runs" / "2026-11-27-h200-fp8.json").read_text())   # one kernel a cast
    assert f"{fused['ratios']['fp8/bf16']:.2f}×" in chapter
    for path in GEMM:
        rec = json.loads(path.read_text())
        done = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_fp8_gpu.py"), "--show", str(path)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "tolerance 0.001: passed" in done.stdout, done.stderr
        forward = rec["rows"][0]
        quoted = f"{forward['scaled_mm_ms']:.3f} ms against bf16's {forward['bf16_ms']:.3f} ms"
        assert quoted in page and quoted in chapter
        assert all(r["max_relative_difference"] < 2e-4 for r in rec["rows"])   # the page's "within 2×10⁻⁴"


def test_show_refuses_a_file_no_run_wrote(tmp_path):
    bad = tmp_path / "notes.json"
    bad.write_text("{}")
    done = bench("--show", str(bad))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "notes.json" in done.stderr


@pytest.mark.stress
def test_fp8_sets_minitron_in_bf16_beside_minitron_in_fp8(tmp_path):
    """--fp8 RECIPE: two minitron sides, no plain loop, and a ratio that is their tokens/s."""
    out = tmp_path / "fp8.json"
    done = bench("--cpu-smoke", "--fp8", "tensorwise", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert list(figures["results"]) == ["minitron", "minitron fp8 tensorwise"]
    assert figures["fp8_flags"] == ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"]
    bf16, fp8 = (r["tokens_per_s"] for r in figures["results"].values())
    assert figures["ratios"]["fp8/bf16"] == pytest.approx(fp8 / bf16, rel=1e-9)
    printed = re.search(rf"^ratio fp8/bf16: ({NUMBER})x \(tokens/s\)$", done.stdout, re.M)
    assert printed and float(printed[1]) == pytest.approx(fp8 / bf16, abs=1e-3)
