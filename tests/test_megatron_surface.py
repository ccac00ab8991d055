"""scripts/megatron_surface.py on a small fake Megatron-LM checkout: which files are launch
units, how a script's variables and a CI case's YAML become a command line, and the verdicts,
totals and blockers it prints (all in this process: no rank starts)."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "megatron_surface.py"
spec = importlib.util.spec_from_file_location("megatron_surface", SCRIPT)
surface = importlib.util.module_from_spec(spec)
spec.loader.exec_module(surface)   # puts scripts/ on sys.path: surface_units imports next
import surface_units  # noqa: E402

GPT_SCRIPT = """\
#!/bin/bash
CHECKPOINT_PATH=$1   # unset when the test reads it: mock data replaces the path
TP=${TP:-2}
MODEL_ARGS=(
    --num-layers 2 --hidden-size 32   # a comment
    --num-attention-heads 4 --seq-length 16 --max-position-embeddings 16
)
TRAINING_ARGS=(--micro-batch-size 1 --global-batch-size $((2*2)) --train-iters 10 --lr 1e-3)
TRAINING_ARGS+=(--lr-decay-style cosine)
EXTRA="--log-params-norm"
EXTRA="$EXTRA --eval-interval 5 --eval-iters 0"
PRETRAIN="pretrain_gpt.py"
torchrun --nproc_per_node 8 $PRETRAIN \\
    "${MODEL_ARGS[@]}" ${TRAINING_ARGS[@]} $EXTRA \\
    --tensor-model-parallel-size $TP --save $CHECKPOINT_PATH --load $CHECKPOINT_PATH \\
    --data-path /data/x_text_document --tokenizer-type GPT2BPETokenizer --vocab-file v.json 2>&1 | tee log
"""
BAD_SCRIPT = """\
python pretrain_gpt.py --num-layers 2 --hidden-size 32 --num-attention-heads 5 --seq-length 16 \\
    --micro-batch-size 1 --frobnicate 3 --tokenizer-type SFTTokenizer --log-num-zeros-in-grad
"""
MODEL_CONF = """\
if [ -z ${HF_MODEL_CKPT} ]; then
    HF_MODEL_CKPT=org/m
fi
MODEL_ARGS=" \\
    --num-layers 4 --hidden-size 64 --num-attention-heads 8 --micro-batch-size 1 \\
    --seq-length 32 --swiglu --tokenizer-type HuggingFaceTokenizer \\
"
"""
CI_OK = """\
ENV_VARS:
  NCCL_ALGO: Ring
MODEL_ARGS:
  --num-layers: 2
  --hidden-size: 32
  --num-attention-heads: 4
  --seq-length: 16
  --micro-batch-size: 1
  --global-batch-size: 8
  --train-iters: 4
  --lr: 1.0e-3
  --pipeline-model-parallel-size: 2
  --deterministic-mode: true
  --sequence-parallel: false
  --recompute-granularity: selective
  --recompute-modules: "[core_attn, mlp]"
  --save: ${CHECKPOINT_SAVE_PATH}
  --tokenizer-type: ${TOKENIZER_TYPE}
TEST_TYPE: regular
"""
CI_TREE = CI_OK.replace("NCCL_ALGO: Ring", "NCCL_ALGO: Tree")


def _write(root: Path, files: dict) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _checkout(root: Path) -> Path:
    cases = "tests/functional_tests/test_cases"
    _write(root, {
        "examples/gpt/train.sh": GPT_SCRIPT,
        "examples/bad/train.sh": BAD_SCRIPT,
        "examples/notes/readme.sh": "echo 'see pretrain_gpt.py'\n",                       # no command
        "examples/mamba/train.sh": GPT_SCRIPT.replace("pretrain_gpt.py", "pretrain_hybrid.py"),
        "examples/post_training/modelopt/conf/org/m.sh": MODEL_CONF,
        "examples/post_training/modelopt/conf/arguments.sh": 'MODEL_ARGS="--nothing"\n',  # not a model
        "examples/post_training/modelopt/train.sh": "python pretrain_gpt.py ${MODEL_ARGS}\n",  # a wrapper
        f"{cases}/gpt/ok_1node/model_config.yaml": CI_OK,
        f"{cases}/gpt/tree/model_config.yaml": CI_TREE,
        f"{cases}/gpt/infer/model_config.yaml": CI_OK + "MODE: inference\n",
        f"{cases}/bert/b/model_config.yaml": CI_OK,
        f"{cases}/gpt-nemo/n/model_config.yaml": "MODEL_ARGS:\n  trainer.devices: 8\n",
    })
    return root


def test_units_and_their_command_lines(tmp_path):
    units = {str(u["path"].relative_to(tmp_path)): u for u in surface.find_units(_checkout(tmp_path))}
    assert sorted(units) == ["examples/bad/train.sh", "examples/gpt/train.sh", "examples/mamba/train.sh",
                             "examples/post_training/modelopt/conf/org/m.sh",
                             "tests/functional_tests/test_cases/gpt/ok_1node/model_config.yaml",
                             "tests/functional_tests/test_cases/gpt/tree/model_config.yaml"]
    gpt = units["examples/gpt/train.sh"]["argv"]
    assert gpt[:10] == ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length",
                        "16", "--max-position-embeddings", "16"]
    assert gpt[gpt.index("--global-batch-size") + 1] == "4" and "cosine" in gpt and "--log-params-norm" in gpt
    assert gpt[gpt.index("--tensor-model-parallel-size") + 1] == "2" and gpt[-1] == "v.json"   # before the pipe
    assert units["examples/mamba/train.sh"]["hybrid"] and not units["examples/gpt/train.sh"]["hybrid"]
    ci = units["tests/functional_tests/test_cases/gpt/ok_1node/model_config.yaml"]
    assert "--deterministic-mode" in ci["argv"] and "--sequence-parallel" not in ci["argv"]
    assert ci["argv"][ci["argv"].index("--recompute-modules"):][:3] == ["--recompute-modules", "core_attn", "mlp"]
    assert surface.world_of(ci["argv"], ci["path"]) == 8     # one node of 8; the layout (pp 2) fits
    assert surface.world_of(gpt, units["examples/gpt/train.sh"]["path"]) == 2


def test_verdicts_totals_and_blockers(tmp_path, capsys):
    root = _checkout(tmp_path)
    assert surface.main(["--megatron", str(root), "--units", "--top", "4"]) == 0
    out = capsys.readouterr().out.splitlines()
    verdicts = {line.split(" (world")[0]: line.split("): ", 1)[1] for line in out if " (world " in line}
    assert verdicts["script examples/gpt/train.sh"] == "accepted"
    assert verdicts["model examples/post_training/modelopt/conf/org/m.sh"] == "accepted"
    assert verdicts["ci tests/functional_tests/test_cases/gpt/ok_1node/model_config.yaml"] == "accepted"
    assert verdicts["ci tests/functional_tests/test_cases/gpt/tree/model_config.yaml"] == (
        "refused: --deterministic-mode: NCCL_ALGO='Tree' is not deterministic; unset it or use Ring, "
        "CollnetDirect, CollnetChain, ^NVLS")
    assert verdicts["script examples/bad/train.sh"].startswith(
        "refused: argument --tokenizer-type: invalid choice: 'SFTTokenizer'")
    assert "launch scripts: 1 accepted of 2" in out and "launch scripts (hybrid): 1 accepted of 1" in out
    assert "model configurations: 1 accepted of 1" in out and "CI training cases: 1 accepted of 2" in out
    # bad/train.sh: the tokenizer minitron lacks, then the unknown flag, then the heads (a core
    # flag's refusal ends the retries); each blocks one unit, as --deterministic-mode blocks the CI case
    top = out[out.index("most frequent blockers (non-hybrid units each flag blocks), top 4:") + 1:]
    assert top == ["  --tokenizer-type: 1", "  --frobnicate: 1", "  --hidden-size: 1", "  --deterministic-mode: 1"]


def test_a_folder_that_is_not_a_checkout_is_one_line(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit) as exit_:
        surface.main(["--megatron", str(tmp_path)])
    assert exit_.value.code == 2 and "has no examples/" in capsys.readouterr().err


def test_arrays_split_as_bash_splits_them():
    """gptoss/02_train.sh keeps "--tokenizer-type NullTokenizer" as one element and expands the
    array unquoted: bash splits it into two words; quoted, an element stays one word."""
    env, _ = surface_units.run_shell('A=("--tokenizer-type NullTokenizer" --mock-data)\n')
    assert surface_units.shlex.split(surface_units._expand("${A[@]}", env)) == ["--tokenizer-type", "NullTokenizer", "--mock-data"]
    assert surface_units.shlex.split(surface_units._expand('"${A[@]}"', env)) == ["--tokenizer-type NullTokenizer", "--mock-data"]
    assert surface_units.yaml_flags({"--cuda-graph-modules": "[attn mlp]", "--x": "[1, 2]"}) == [
        "--cuda-graph-modules", "attn", "mlp", "--x", "1", "2"]
    # a scalar with spaces is one word, as CI's launcher passes KEY="VALUE" (gpt3_15b_8t_release)
    assert surface_units.yaml_flags({"--step-batch-size-schedule": "0:384 200B:768"}) == [
        "--step-batch-size-schedule", "0:384 200B:768"]


def test_a_wrapper_that_names_no_flag_is_not_a_unit(tmp_path):
    """sc21/SRUN.sh runs pretrain_gpt.py ${MEGATRON_PARAMS}, set by the scripts that source it."""
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "SRUN.sh").write_text('CMD="python -u pretrain_gpt.py ${MEGATRON_PARAMS}"\nsh -c "$CMD"\n')
    assert surface.find_units(tmp_path) == []


def test_the_world_fits_distributed_optimizer_instances():
    argv = ["--tensor-model-parallel-size", "2", "--num-distributed-optimizer-instances", "2"]
    assert surface.world_of(argv, Path("test_cases/gpt/x/model_config.yaml")) == 4   # dp 2: two instances


def test_a_ci_placeholder_value_leaves_the_flag_to_its_default(tmp_path):
    argv = surface.mock(["--seed", "${REPEAT}", "--lr", "1e-3", "--save", "${CHECKPOINT_SAVE_PATH}"], str(tmp_path))
    assert "--seed" not in argv and argv[:2] == ["--lr", "1e-3"] and "--save" in argv
