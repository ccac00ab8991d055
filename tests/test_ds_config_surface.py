"""scripts/ds_config_surface.py: its battery, minitron's verdicts on a handful of its configs, the
way it classifies a disagreement, and the chapter's totals (walkthrough/14-deepspeed.md prints
docs/ds-config-surface.json, which the script wrote). The DeepSpeed side runs only under the
`deepspeed` mark, in DeepSpeed's own interpreter."""
import json
import re
import sys
from pathlib import Path

import pytest

from deepspeed_child import needs_deepspeed

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import ds_config_surface as surface  # noqa: E402

# A few configs of the battery, by name, and what minitron says of each: None (accepted) or a
# fragment of its one-line refusal.
CASES = {
    "triad batch=8,micro=2,accum=2": None,                        # 8 = 2 x 2 x dp 2
    "triad batch=6,micro=2,accum=2": "6 != 2 * 2 * 2",            # DeepSpeed's check, its wording
    "triad none": "Either train_batch_size or train_micro_batch_size_per_gpu",
    "top.fp_16=unknown": "unknown key 'fp_16'; did you mean 'fp16'",
    "comet.project=bad": "comet.project must be a string",        # DeepSpeed's CometConfig refuses it
    "zero_optimization.compute_grad_norm=default": None,          # DeepSpeed's default: what minitron does
    "zero_optimization.compute_grad_norm=typical": None,          # false: no norm, as DeepSpeed skips it
    "optimizer[AdamW].amsgrad=default": None,                    # FusedAdam's default: minitron's Adam
    "optimizer[AdamW].amsgrad=typical": "torch_adam",            # FusedAdam refuses AMSGrad: DeepSpeed's fix named
    "optimizer[AdamW].bias_correction=typical": None,            # false: the Adam step without it, as FusedAdam's
    "optimizer.type=MuAdam": "mup",                              # DeepSpeed imports it from mup, not installed
    "scheduler.type=StepLR": None,                               # torch's schedule on a torch optimizer (fp32)
    "scheduler.type=StepLR with fp16": "is not an Optimizer",    # ... on fp16's wrapper, which torch refuses
    "zero_optimization.offload_optimizer.super_offload=typical": "Grace-Hopper",
    "comms_logger.verbose=typical": None,                        # the logger stays off: nothing asked
    "full ZeRO-3 bf16 offload=cpu": None,
    "full Hugging Face template (ZeRO-2, auto)": "got 'auto'",   # the Trainer fills the triad in first
    "full Hugging Face template, filled in": None,
}


@pytest.fixture(scope="module")
def units(tmp_path_factory):
    folder = tmp_path_factory.mktemp("battery")
    every = surface.write_battery(folder)
    return every, {u["name"]: u for u in every}


def test_battery_covers_the_surface(units):
    every, by_name = units
    assert len(by_name) == len(every) >= 400   # names are unique: each verdict is findable
    kinds = {u["kind"] for u in every}
    assert kinds == {"default", "typical", "bad", "unknown", "triad", "type", "full"}
    # every documented key at three values, the triad in every combination of given and missing
    assert sum(u["kind"] == "default" for u in every) == sum(u["kind"] == "bad" for u in every) >= 150
    assert sum(u["kind"] == "triad" for u in every) >= 40


def test_minitron_verdicts(units):
    _, by_name = units
    for name, expected in CASES.items():
        verdict = surface.minitron_verdict(by_name[name]["path"])
        if expected is None:
            assert verdict is None, (name, verdict)
        else:
            assert verdict is not None and expected in verdict, (name, verdict)


def test_committed_json_is_minitrons_today(units):
    """docs/ds-config-surface.json's minitron count is what minitron says now: a change to what a
    ds_config may hold changes the chapter's figures, and the file must be written again."""
    every, _ = units
    totals = json.loads((ROOT / "docs/ds-config-surface.json").read_text())
    accepted = sum(surface.minitron_verdict(u["path"]) is None for u in every)
    assert (totals["configs"], totals["minitron_accepts"]) == (len(every), accepted), (
        "write docs/ds-config-surface.json again: .venv/bin/python scripts/ds_config_surface.py "
        "--deepspeed-python /tmp/vds/bin/python --json docs/ds-config-surface.json")


def test_classify():
    accepted = {"accepted": True, "stage": "initialize", "reason": None}
    refused = {"accepted": False, "stage": "config", "reason": "AssertionError: ..."}

    def unit(kind, ours, theirs, config=None):
        return {"kind": kind, "minitron": ours, "deepspeed": theirs, "config": config or {}}
    assert surface.classify(unit("typical", None, accepted)) is None
    assert surface.classify(unit("bad", "x must be...", refused)) is None
    assert surface.classify(unit("unknown", "unknown key 'fp_16'", accepted)) == "unknown"
    assert surface.classify(unit("bad", "steps_per_print must be a whole number", accepted)) == "bad"
    assert surface.classify(unit("typical", "minitron implements only", accepted)) == "feature"
    assert surface.classify(unit("full", "aio: unknown key 'thread_count'", accepted)) == "unknown"
    assert surface.classify(unit("typical", None, refused)) == "bug"
    master = {"bf16": {"enabled": True, "bf16_master_weights_and_grads": True}}
    assert surface.classify(unit("typical", "needs ZeRO-Offload", accepted, master)) == "later"


def test_chapter_prints_the_committed_json():
    totals = json.loads((ROOT / "docs/ds-config-surface.json").read_text())
    page = (ROOT / "walkthrough/14-deepspeed.md").read_text()
    assert "<!-- run: python scripts/ds_config_surface.py --from-json docs/ds-config-surface.json -->" in page
    # the prose's figures are the file's
    words = (r"Of (\d+) ds_configs.*?DeepSpeed 0\.19\.8 accepts (\d+).*?refuses (\d+) of them: (\d+) unknown keys?"
             r".*?(\d+) bad values?.*?(\d+) DeepSpeed features?")
    prose = re.search(words.replace(" ", r"\s+"), page, re.S)   # wherever the lines break
    assert prose, "the chapter's paragraph on scripts/ds_config_surface.py moved or changed its wording"
    assert [int(n) for n in prose.groups()] == [
        totals["configs"], totals["deepspeed_accepts"], totals["deepspeed_accepts_minitron_refuses"],
        totals["classes"]["unknown"], totals["classes"]["bad"], totals["classes"]["feature"]]


@needs_deepspeed
def test_deepspeed_side(units, tmp_path):
    """DeepSpeed's verdicts on a few configs (this interpreter is DeepSpeed's: the peer runs in it)."""
    _, by_name = units
    names = ["triad batch=6,micro=2,accum=2", "top.fp_16=unknown", "comet.project=bad", "optimizer.type=Adagrad",
             "scheduler[WarmupLR].warmup_type=bad", "optimizer[AdamW].max_grad_norm=typical", "optimizer.type=MuAdam",
             "optimizer[AdamW].amsgrad=typical", "scheduler.type=StepLR", "scheduler.type=StepLR with ZeRO-1",
             "scheduler.type=StepLR with bf16", "optimizer.type=RMSprop with ZeRO-1"]
    for i, name in enumerate(names):
        (tmp_path / f"{i:04d}.json").write_text(json.dumps(by_name[name]["config"]))
    got = surface.deepspeed_verdicts(sys.executable, tmp_path)
    verdict = {name: got[f"{i:04d}.json"] for i, name in enumerate(names)}
    assert not verdict["triad batch=6,micro=2,accum=2"]["accepted"]
    assert verdict["triad batch=6,micro=2,accum=2"]["stage"] == "config"
    assert verdict["top.fp_16=unknown"]["accepted"]               # DeepSpeed ignores a key it does not know
    assert not verdict["comet.project=bad"]["accepted"]
    assert verdict["optimizer.type=Adagrad"]["accepted"]
    assert verdict["scheduler[WarmupLR].warmup_type=bad"]["accepted"]   # it warns and falls back to log
    assert verdict["optimizer[AdamW].max_grad_norm=typical"]["stage"] == "initialize"
    # what the engine's own optimizer and scheduler methods refuse, each where deepspeed.initialize does
    refusals = {"optimizer.type=MuAdam": "MuAdam", "optimizer[AdamW].amsgrad=typical": "AMSGrad",
                "scheduler.type=StepLR with ZeRO-1": "DeepSpeedZeroOptimizer is not an Optimizer",
                "scheduler.type=StepLR with bf16": "FP16_UnfusedOptimizer is not an Optimizer",
                "optimizer.type=RMSprop with ZeRO-1": "untested ZeRO Optimizer"}
    for name, fragment in refusals.items():
        assert (verdict[name]["accepted"], verdict[name]["stage"]) == (False, "initialize"), (name, verdict[name])
        assert fragment in verdict[name]["reason"], (name, verdict[name])
    assert verdict["scheduler.type=StepLR"]["accepted"]          # fp32 without ZeRO: a torch optimizer
