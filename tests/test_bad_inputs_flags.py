"""Every bad flag of trace, pretrain, estimate, groups and the top-level command gets ONE line,
exit code 2, no traceback, nothing left running, and no torch imported: the battery of issue
#25, kept as a table.

Each row is a command line and the words its one line must contain (the flag it is about, as
the user spelled it or as Megatron names it). They run through tests/refusals.py in a
torch-free interpreter (a few rows forked one child each, the rest one after another in it), so
"refused before torch" is seen as the user sees it, and a row that wrongly starts work is
killed, not waited for. The rows are built
from a few tables (each layout flag x each kind of bad number, each size flag x its bounds,
each debug option, each divisibility rule), so that a new flag gets every variant at once.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from refusals import Case, run_cases

MODEL = "--num-layers 2 --hidden-size 16 --num-attention-heads 2 --seq-length 16 --micro-batch-size 1"
TRAIN = f"{MODEL} --train-iters 2 --lr 1e-3 --mock-data"
UNIVERSAL_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "docs", "examples", "ds_config_universal.json")
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}   # nccl is then refused on any machine, GPU or not
DIGITS_5000 = "7" * 5000
# What an int option must refuse, as typed: (text, words beyond the flag's name). Each command's
# own bound answers a big one; the parser answers the rest.
NOT_INTS = [("1e20", "whole number"), ("nan", "whole number"), ("", "whole number"), ("2.5", "whole number"),
            ("two", "whole number"), (DIGITS_5000, "5,000 digits")]


def rows() -> list[tuple[str, list[str], tuple[str, ...], dict | None]]:
    """(id, argv, must_contain, env) for every case."""
    out = []

    def add(cid, argv, *words, env=None):
        out.append((cid, argv if isinstance(argv, list) else argv.split(), words, env))

    # --- the top level --------------------------------------------------------------------
    add("top-unknown-option", "--bogus", "--bogus")
    add("top-unknown-command", "bogus-command", "bogus-command")
    add("top-unknown-flag-trace", "trace --world 2 --wrld 2", "--wrld")
    add("top-typo-pretrain", f"pretrain --world 1 {TRAIN} --num-layer 2", "--num-layer")
    add("top-typo-estimate", f"estimate --world 1 {MODEL} --hiden-size 8", "--hiden-size")
    add("top-typo-groups", "groups --world 8 --tpp 2", "--tpp")

    # --- --world on every command: the parse, zero, negative, and each command's bound ----
    for cmd, rest in (("groups", []), ("trace", []), ("estimate", MODEL.split()), ("pretrain", TRAIN.split())):
        for text, words in (NOT_INTS if cmd == "trace" else NOT_INTS[:2]):
            add(f"{cmd}-world-{text[:6] or 'empty'}", [cmd, "--world", text, *rest], "--world", words)
        add(f"{cmd}-world-0", [cmd, "--world", "0", *rest], "--world", "at least 1")
        add(f"{cmd}-world-negative", [cmd, "--world", "-3", *rest], "--world", "at least 1")
    add("groups-world-huge", ["groups", "--world", str(10**23)], "--world", "at most 131072")
    add("groups-world-131073", "groups --world 131073", "--world", "at most 131072")
    add("groups-rank-outside", "groups --world 16 --rank 16", "--rank 16", "0..15")
    add("groups-rank-negative", "groups --world 16 --rank -1", "--rank -1", "0..15")
    add("trace-world-1e9", "trace --world 1000000000", "--world", "at most", "per core")
    add("trace-world-fake", "trace --world 5000 --backend fake", "--world", "at most 2048")
    add("trace-world-gloo", "trace --world 10000 --backend gloo", "--world", "at most", "per core")
    add("estimate-world-huge", f"estimate --world 1000000000 {MODEL}", "--world", "at most 131072")
    add("estimate-world-131073", f"estimate --world 131073 {MODEL}", "--world", "at most 131072")
    add("estimate-world-missing", f"estimate {MODEL}", "--world")
    add("pretrain-world-huge", f"pretrain --world 1000000000 {TRAIN}", "--world", "at most", "per core")

    # --- the layout flags of groups and trace: each bad number ------------------------------
    layout = {"--tp": "tensor-model-parallel", "--pp": "pipeline-model-parallel", "--cp": "context-parallel",
              "--ep": "expert-model-parallel", "--vp": "virtual-pipeline-model-parallel"}
    for cmd, forms in (("groups", (("nan", "whole number"), ("-2", "at least 1"))), ("trace", (("", "whole number"),))):
        for flag, name in layout.items():
            extra = ["--pp", "2"] if flag == "--vp" else []   # a virtual pipeline needs a pipeline
            for text, words in forms:
                where = flag if "whole" in words else name
                add(f"{cmd}{flag}-{text or 'empty'}", [cmd, "--world", "8", *extra, flag, text], where, words)
            add(f"{cmd}{flag}-0", [cmd, "--world", "8", *extra, flag, "0"], name, "at least 1")
            if flag != "--vp":
                add(f"{cmd}{flag}-huge", [cmd, "--world", "8", flag, str(10**12)], "not divisible", "1000000000000")
    # every divisibility rule of the layout (validate_parallel_sizes), on both commands
    for cmd in ("groups", "trace"):
        add(f"{cmd}-tp-divides", f"{cmd} --world 8 --tp 3", "tensor x pipeline x context", "8")
        add(f"{cmd}-pp-divides", f"{cmd} --world 8 --tp 2 --pp 3", "tensor x pipeline x context", "8")
        add(f"{cmd}-cp-divides", f"{cmd} --world 8 --cp 3", "tensor x pipeline x context", "8")
        add(f"{cmd}-ep-divides", f"{cmd} --world 8 --tp 2 --pp 2 --ep 4", "expert tensor x expert model", "8")
        add(f"{cmd}-vp-needs-pp", f"{cmd} --world 8 --vp 2", "virtual pipeline", "pipeline-model-parallel")
        add(f"{cmd}-order", f"{cmd} --world 8 --order tp-pp", "--order", "tp-cp-ep-dp-pp")
    add("groups-svg-too-many", "groups --world 4096 --svg", "--svg", "--json")

    # --- trace's own options ---------------------------------------------------------------
    add("trace-rank-outside", "trace --world 4 --rank 4", "--rank", "0..3")
    add("trace-rank-negative", "trace --world 4 --rank -1", "--rank")
    add("trace-steps-negative", "trace --world 2 --steps -1", "--steps", "0..100")
    add("trace-steps-huge", "trace --world 2 --steps 1000000", "--steps", "0..100")
    add("trace-steps-nan", "trace --world 2 --steps nan", "--steps", "whole number")
    add("trace-depth-0", "trace --world 2 --depth 0", "--depth")
    add("trace-backend-foo", "trace --world 2 --backend foo", "--backend", "gloo")
    add("trace-backend-nccl", "trace --world 2 --backend nccl", "--backend nccl", "GPU", env=NO_GPU)
    add("trace-show-bogus", "trace --world 2 --show bogus", "bogus")
    add("trace-show-schedule", "trace --world 2 --show schedule", "--show schedule", "--steps")
    add("trace-steps-fake", "trace --world 2 --steps 1 --backend fake", "--steps", "fake")
    add("trace-debug-fake", "trace --world 2 --debug 0 --backend fake", "--debug", "gloo")
    # --ranks: a few ranks of a fake world (issue 30)
    fake = "trace --backend fake --world 131072 --tp 8 --pp 16"
    add("trace-ranks-outside", f"{fake} --ranks 0,131072", "--ranks", "outside the world", "0..131071")
    add("trace-ranks-range-outside", f"{fake} --ranks 0-1000000000000", "--ranks", "outside the world")
    add("trace-ranks-twice", f"{fake} --ranks 5,3-6", "--ranks", "rank 5 twice")
    add("trace-ranks-empty", [*fake.split(), "--ranks", ""], "--ranks", "names no rank")
    add("trace-ranks-commas", f"{fake} --ranks ,,", "--ranks", "names no rank")
    add("trace-ranks-garbage", f"{fake} --ranks 1,x", "--ranks", "'x'", "0-3")
    add("trace-ranks-negative", f"{fake} --ranks -1", "--ranks", "'-1'")
    add("trace-ranks-backwards", f"{fake} --ranks 9-3", "--ranks", "3-9")
    add("trace-ranks-gloo", "trace --world 4 --ranks 0", "--ranks", "--backend fake")
    add("trace-ranks-nccl", "trace --world 4 --backend nccl --ranks 0", "--ranks", "--backend fake")
    add("trace-ranks-too-many", f"{fake} --ranks 0-99", "--ranks", "at most 32", "fewer")
    add("trace-ranks-world-huge", "trace --backend fake --world 262144 --ranks 0", "--world", "at most 131072")
    add("trace-ranks-rank-not-played", f"{fake} --ranks 0,5 --rank 3", "--rank 3", "--ranks")
    add("trace-world-fake-ranks-hint", "trace --world 4096 --backend fake", "--world", "--ranks")
    add("trace-master-port", "trace --world 2 --backend gloo --master-port 70000", "--master-port", "65535")
    add("trace-moe-topk-dense", "trace --world 1 -- --moe-router-topk 2", "--moe-router-topk", "--num-experts")
    # a training step of MoE at tp > 1 needs sequence parallelism (initialization alone runs it)
    add("trace-moe-tp-no-sp", "trace --world 2 --tp 2 --steps 1 -- --num-experts 4 --disable-bias-linear",
        "--sequence-parallel", "first training forward")
    add("trace-megatron-layers", "trace --world 1 -- --num-layers 5000", "--num-layers", "at most 1,024")
    add("trace-megatron-typo", "trace --world 1 -- --num-layrs 2", "--num-layrs")

    # --- the debug options, on trace and pretrain --------------------------------------------
    for cmd, rest in (("trace", ["--world", "4"]), ("pretrain", ["--world", "4", *TRAIN.split()])):
        debug = [("rank-outside", ["--debug", "9"], ("--debug", "0..3")),
                 ("ranks-garbage", ["--debug", "x"], ("--debug",)),
                 ("port-70000", ["--debug-port-base", "70000"], ("--debug-port-base 70000", "65535")),
                 ("port-0", ["--debug-port-base", "0"], ("--debug-port-base 0",)),
                 ("port-negative", ["--debug-port-base", "-1"], ("--debug-port-base",)),
                 ("port-past-end", ["--debug", "all", "--debug-port-base", "65534"], ("--debug-port-base", "65535")),
                 ("port-nan", ["--debug-port-base", "nan"], ("--debug-port-base", "whole number")),
                 ("port-1e20", ["--debug-port-base", "1e20"], ("--debug-port-base", "whole number")),
                 ("port-empty", ["--debug-port-base", ""], ("--debug-port-base", "whole number")),
                 ("host-empty", ["--debug-host", ""], ("--debug-host",)),
                 ("host-blank", ["--debug-host", "   "], ("--debug-host",)),
                 ("host-not-a-name", ["--debug-host", "not a host"], ("--debug-host 'not a host'", "cannot listen")),
                 ("host-not-this-machine", ["--debug-host", "192.0.2.1"], ("--debug-host '192.0.2.1'", "cannot listen")),
                 ("wait-nan", ["--debug-wait-timeout", "nan"], ("--debug-wait-timeout", "finite")),
                 ("wait-inf", ["--debug-wait-timeout", "inf"], ("--debug-wait-timeout", "finite")),
                 ("wait-1e400", ["--debug-wait-timeout", "1e400"], ("--debug-wait-timeout", "finite")),
                 ("wait-0", ["--debug-wait-timeout", "0"], ("--debug-wait-timeout",)),
                 ("wait-negative", ["--debug-wait-timeout", "-5"], ("--debug-wait-timeout",)),
                 ("wait-text", ["--debug-wait-timeout", "soon"], ("--debug-wait-timeout", "number")),
                 ("wait-empty", ["--debug-wait-timeout", ""], ("--debug-wait-timeout", "number"))]
        for cid, flags, words in (debug if cmd == "trace" else debug[::3]):
            add(f"{cmd}-debug-{cid}", [cmd, *flags, *rest], *words)
    # launch too: the host is refused before the ranks start, not by rank 0 once all have
    add("launch-debug-host-not-a-name", ["launch", "--world", "2", "--debug", "0", "--debug-host", "not a host",
                                         str(DEMO), "show"], "--debug-host 'not a host'")

    # --- pretrain: the backend, the sizes, the machine -----------------------------------------
    add("pretrain-backend-fake", f"pretrain --world 1 --backend fake {TRAIN}", "--backend fake", "gloo")
    add("pretrain-backend-foo", f"pretrain --world 1 --backend foo {TRAIN}", "--backend", "gloo")
    add("pretrain-backend-nccl", f"pretrain --world 1 --backend nccl {TRAIN}", "--backend nccl", "GPU", env=NO_GPU)
    add("pretrain-distributed-nccl", f"pretrain --world 1 {TRAIN} --distributed-backend nccl",
        "--distributed-backend nccl", env=NO_GPU)
    add("pretrain-no-iters", f"pretrain --world 1 {MODEL} --lr 1e-3 --mock-data", "--train-iters")
    # each size flag: zero, negative, not a number, past its ceiling
    sizes = ["--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length", "--micro-batch-size",
             "--global-batch-size", "--vocab-size", "--ffn-hidden-size", "--kv-channels",
             "--max-position-embeddings", "--train-iters", "--num-workers", "--log-interval",
             "--tensor-model-parallel-size", "--pipeline-model-parallel-size"]
    for flag in sizes:
        low = "at least 0" if flag in ("--train-iters", "--num-workers") else "at least 1"
        add(f"pretrain{flag}-negative", f"pretrain --world 1 {TRAIN} {flag} -4", flag, low)
        add(f"pretrain{flag}-huge", f"pretrain --world 1 {TRAIN} {flag} {10**20}", flag, "at most")
    for flag in sizes[:6:2]:   # the parser's one type reads them all: a sample of the other forms
        add(f"pretrain{flag}-0", f"pretrain --world 1 {TRAIN} {flag} 0", flag, "at least 1")
        add(f"pretrain{flag}-1e20", f"pretrain --world 1 {TRAIN} {flag} 1e20", flag, "whole number")
        add(f"pretrain{flag}-nan", f"pretrain --world 1 {TRAIN} {flag} nan", flag, "whole number")
    add("pretrain-layers-1025", f"pretrain --world 1 {TRAIN} --num-layers 1025", "--num-layers", "at most 1,024")
    add("pretrain-digits", f"pretrain --world 1 {TRAIN} --seq-length {DIGITS_5000}", "--seq-length", "5,000 digits")
    # too big for this machine: the accountant's bytes, the dataset index, the workers
    add("pretrain-model-too-big", f"pretrain --world 1 {TRAIN} --hidden-size 1000000", "the model needs",
        "--hidden-size")
    add("pretrain-vocab-too-big", f"pretrain --world 1 {TRAIN} --vocab-size 2000000000", "the model needs",
        "--vocab-size")
    add("pretrain-seq-too-big", f"pretrain --world 1 {TRAIN} --seq-length 1000000000 --max-position-embeddings "
        "1000000000", "the model needs", "--seq-length")
    add("pretrain-micro-too-big", f"pretrain --world 1 {TRAIN} --micro-batch-size 1000000000", "the model needs",
        "--micro-batch-size")
    add("pretrain-iters-too-many", f"pretrain --world 1 {TRAIN} --train-iters 2000000000 --global-batch-size 1024",
        "--train-iters", "at most")
    add("pretrain-eval-too-many", f"pretrain --world 1 {TRAIN} --eval-interval 1 --eval-iters 2147483647",
        "--eval-iters", "samples to index")
    add("pretrain-workers-too-many", f"pretrain --world 1 {TRAIN} --num-workers 100000", "--num-workers", "per core")
    # the overlapped parameter all-gather: Megatron's two rules, and a bucket of no elements
    add("pretrain-overlap-gather-no-distopt", f"pretrain --world 2 {TRAIN} --overlap-grad-reduce --overlap-param-gather",
        "--overlap-param-gather", "--use-distributed-optimizer")
    add("pretrain-overlap-gather-no-overlap-reduce",
        f"pretrain --world 2 {TRAIN} --use-distributed-optimizer --overlap-param-gather",
        "--overlap-param-gather", "--overlap-grad-reduce")
    add("pretrain-overlap-reduce-deepspeed", f"pretrain --world 2 {TRAIN} --overlap-grad-reduce --deepspeed "
        "--deepspeed-config docs/examples/ds_config_pretrain.json", "--overlap-grad-reduce", "overlap_comm")
    add("pretrain-ddp-bucket-size-0", f"pretrain --world 2 {TRAIN} --overlap-grad-reduce --ddp-bucket-size 0",
        "--ddp-bucket-size", "at least 1")
    # numbers and their ranges
    for flag, text, words in [("--initial-loss-scale", "1e400", "finite"), ("--initial-loss-scale", "1e30", "2**64"),
                              ("--initial-loss-scale", "0", "> 0"), ("--loss-scale", "1e30", "2**64"),
                              ("--min-loss-scale", "-1", "> 0"), ("--lr", "nan", "finite"), ("--lr", "inf", "finite"),
                              ("--lr", "-1", ">= 0"), ("--hidden-dropout", "1", "< 1"), ("--seed", "-1", "at least 0"),
                              ("--seed", str(2**31), "at most"), ("--timing-log-level", "5", "choice"),
                              ("--optimizer", "foo", "choice"), ("--adam-eps", "0", "> 0"),
                              ("--exit-interval", "0", "at least 1"), ("--rotary-percent", "0", "> 0")]:
        add(f"pretrain{flag}-{text}", f"pretrain --world 1 {TRAIN} {flag} {text}", flag, words)
    # --data-path: missing files and weights that are not positive finite numbers
    data = f"pretrain --world 1 {MODEL} --train-iters 2 --lr 1e-3 --data-path"
    for cid, rest, words in [("missing", "missing_prefix", ("missing_prefix.idx",)),
                             ("inf", "inf pfx", ("--data-path", "finite")),
                             ("nan", "nan pfx 1 pfx2", ("--data-path", "finite")),
                             ("zero", "0 pfx 1 pfx2", ("--data-path", "positive")),
                             ("suffix", "corpus.bin", ("--data-path", ".bin")),
                             ("mixed", "0.5 a b", ("--data-path",)),
                             ("split", "pfx --split 1,x", ("--split",))]:
        add(f"pretrain-data-{cid}", f"{data} {rest}", *words)
    add("pretrain-data-and-mock", f"pretrain --world 1 {TRAIN} --data-path pfx", "--data-path", "--mock-data")
    add("pretrain-ckpt-format", f"pretrain --world 1 {TRAIN} --ckpt-format zarr", "--ckpt-format", "torch_dist")
    add("pretrain-ckpt-convert-no-load", f"pretrain --world 1 {TRAIN} --ckpt-convert-format torch_dist",
        "--ckpt-convert-format", "--load", "--ckpt-convert-save")
    add("pretrain-no-data", f"pretrain --world 1 {MODEL} --train-iters 2 --lr 1e-3", "--data-path")

    # --- rules between flags, on pretrain and estimate alike (one validation) ------------------
    between = [("tp-divides", "--world 8 --tensor-model-parallel-size 3", ("tensor x pipeline",)),
               ("layers-pp", "--world 2 --pipeline-model-parallel-size 2 --num-layers 3", ("--num-layers 3",)),
               ("heads-tp", "--world 2 --tensor-model-parallel-size 2 --num-attention-heads 3 --hidden-size 18",
                ("--num-attention-heads 3",)),
               ("hidden-heads", "--world 1 --hidden-size 15", ("--hidden-size 15",)),
               ("ffn-tp", "--world 2 --tensor-model-parallel-size 2 --ffn-hidden-size 7", ("--ffn-hidden-size 7",)),
               ("positions", "--world 1 --max-position-embeddings 8", ("--max-position-embeddings 8",)),
               ("sp-seq", "--world 2 --tensor-model-parallel-size 2 --sequence-parallel --seq-length 15",
                ("--seq-length 15",)),
               ("cp-seq", "--world 2 --context-parallel-size 2 --seq-length 6", ("--seq-length 6",)),
               ("vp-layers", "--world 2 --pipeline-model-parallel-size 2 --virtual-pipeline-model-parallel-size 2",
                ("--num-layers 2",)),
               ("vp-0", "--world 2 --pipeline-model-parallel-size 2 --virtual-pipeline-model-parallel-size 0",
                ("--virtual-pipeline-model-parallel-size",)),
               ("batch", "--world 2 --global-batch-size 3", ("--global-batch-size 3",)),
               ("fp16-bf16", "--world 1 --fp16 --bf16", ("--fp16", "--bf16")),
               ("ep-no-experts", "--world 2 --expert-model-parallel-size 2", ("--num-experts",)),
               ("experts-ep", "--world 2 --expert-model-parallel-size 2 --num-experts 3", ("--num-experts 3",)),
               ("moe-tp-no-sp", "--world 4 --tp 2 --num-experts 4 --ep 2 --disable-bias-linear",
                ("--sequence-parallel", "first training forward")),
               ("topk-experts", "--world 1 --num-experts 2 --moe-router-topk 4", ("--moe-router-topk 4",)),
               ("swiglu-moe", "--world 1 --num-experts 2 --swiglu", ("--swiglu",)),
               ("gqa-none", "--world 1 --group-query-attention", ("--num-query-groups",)),
               ("groups-no-gqa", "--world 1 --num-query-groups 2", ("--group-query-attention",)),
               ("recompute-full", "--world 1 --recompute-granularity full", ("--recompute-method",)),
               ("mrope", "--world 1 --position-embedding-type mrope", ("--position-embedding-type mrope",)),
               ("rope-scaling-learned", "--world 1 --use-rope-scaling", ("--use-rope-scaling", "rope")),
               ("interleaved-none", "--world 1 --position-embedding-type none --rotary-interleaved",
                ("--rotary-interleaved", "none")),
               ("cp-allgather", "--world 2 --cp 2 --cp-comm-type allgather", ("--cp-comm-type allgather",)),
               ("cp-a2a-heads", "--world 4 --cp 4 --cp-comm-type a2a", ("--cp-comm-type a2a", "2 heads")),
               ("cp-hier-none", "--world 4 --cp 4 --cp-comm-type a2a+p2p", ("--hierarchical-context-parallel-sizes",)),
               ("cp-hier-product", "--world 4 --cp 4 --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 4",
                ("--hierarchical-context-parallel-sizes 2 4", "multiply")),
               ("cp-per-layer", "--world 2 --cp 2 --cp-comm-type a2a p2p p2p", ("--cp-comm-type", "got 3")),
               ("rampup-zero", "--world 1 --rampup-batch-size 0 1 1", ("--rampup-batch-size",))]
    for flag in ("--moe-router-topk 2", "--moe-aux-loss-coeff 0.1", "--moe-layer-freq 2", "--moe-ffn-hidden-size 8",
                 "--moe-expert-capacity-factor 1", "--moe-pad-expert-input-to-capacity"):
        between.append((f"dense{flag.split()[0]}", f"--world 1 {flag}", (flag.split()[0], "--num-experts")))
    for number, (cid, flags, words) in enumerate(between):
        add(f"estimate-{cid}", f"estimate {MODEL} {flags}", *words)
        if number % 3 == 0 or cid.startswith("moe"):   # the same validate_pretrain: a sample, MoE's rule among it
            add(f"pretrain-{cid}", f"pretrain {TRAIN} {flags}", *words)
    for cid, flags, words in [("warmup-iters", "--lr-warmup-iters 2", ("--lr-warmup-iters",)),
                              ("warmup-fraction", "--lr-warmup-fraction 1", ("--lr-warmup-fraction",)),
                              ("timeout-huge", "--distributed-timeout-minutes 2147483647",
                               ("--distributed-timeout-minutes", "at most 1,000,000")),
                              ("both-lengths", "--train-samples 4", ("--train-iters", "--train-samples")),
                              ("min-lr", "--min-lr 0.1", ("--min-lr",))]:
        add(f"pretrain-{cid}", f"pretrain --world 1 {TRAIN} {flags}", *words)

    # --- the schedule flags (issue #27): units, WSD, decoupled lr, step schedules ------------
    samples = f"pretrain --world 1 {MODEL} --lr 1e-3 --mock-data --train-samples 8"
    iters = f"pretrain --world 1 {TRAIN}"
    for cid, argv, words in [
            ("decay-samples-iters", f"{iters} --lr-decay-samples 8", ("--lr-decay-samples", "--train-iters")),
            ("decay-iters-samples", f"{samples} --lr-decay-iters 2", ("--lr-decay-iters", "--train-samples")),
            ("warmup-samples-long", f"{samples} --lr-warmup-samples 8", ("--lr-warmup-samples", "warm up for fewer")),
            ("wsd-missing", f"{iters} --lr-decay-style WSD", ("--lr-wsd-decay-iters",)),
            ("wsd-unused", f"{iters} --lr-wsd-decay-iters 1", ("--lr-wsd-decay-iters", "WSD")),
            ("warmup-init", f"{iters} --lr-warmup-init 1", ("--lr-warmup-init", "--lr")),
            ("decoupled-min-alone", f"{iters} --decoupled-min-lr 1e-4", ("--decoupled-min-lr", "--decoupled-lr")),
            ("decoupled-floor", f"{iters} --decoupled-lr 1e-4 --decoupled-min-lr 1e-3", ("--decoupled-min-lr",)),
            ("step-iters", f"{iters} --step-batch-size-schedule 0:1", ("--step-batch-size-schedule", "--train-samples")),
            ("step-gbs", f"{samples} --global-batch-size 2 --step-batch-size-schedule 0:2", ("--global-batch-size",)),
            ("step-format", f"{samples} --step-batch-size-schedule 16", ("--step-batch-size-schedule", "THRESHOLD")),
            ("step-split", f"pretrain --world 2 {MODEL} --lr 1e-3 --mock-data --train-samples 8 "
                           "--step-batch-size-schedule 0:2,32:3", ("--step-batch-size-schedule", "global batch of 3"))]:
        add(f"pretrain-{cid}", argv, *words)
    # --- --deepspeed --load with the ds_config's checkpoint.load_universal --------------------
    universal = f"--global-batch-size 4 --deepspeed --deepspeed-config {UNIVERSAL_CONFIG}"
    add("pretrain-universal-no-latest", f"pretrain --world 1 {TRAIN} {universal} --load {os.devnull}-none",
        "--load", "no latest_universal", "ds_to_universal")
    add("pretrain-universal-tp2", f"pretrain --world 2 {TRAIN} {universal} --tensor-model-parallel-size 2 --load x",
        "--tensor-model-parallel-size 2", "tensor-parallel size 1")

    # --- estimate's own ---------------------------------------------------------------------
    add("estimate-layers-1e9", f"estimate --world 1 {MODEL} --num-layers 1000000000", "--num-layers", "at most 1,024")
    add("estimate-experts-2000", f"estimate --world 1 {MODEL} --num-experts 2000", "--num-experts", "at most 1,024")
    add("estimate-capacity-1e300", f"estimate --world 1 {MODEL} --num-experts 4 --moe-expert-capacity-factor 1e300",
        "--moe-expert-capacity-factor", "1024")
    add("estimate-check-and-flags", f"estimate --check somewhere --world 2 {MODEL}", "--check")
    add("estimate-check-empty", "estimate --check .", "rank*.jsonl")
    add("estimate-seq-0", f"estimate --world 1 {MODEL} --seq-length 0", "--seq-length", "at least 1")
    add("estimate-seq-nan", f"estimate --world 1 {MODEL} --seq-length nan", "--seq-length", "whole number")
    add("estimate-window-one-number", f"estimate --world 1 {MODEL} --window-size 4", "--window-size", "LEFT,RIGHT")
    add("estimate-window-below", f"estimate --world 1 {MODEL} --window-size=-2,0", "--window-size", "-1")
    add("estimate-window-skip-alone", f"estimate --world 1 {MODEL} --window-attn-skip-freq 2", "--window-size")
    add("estimate-window-skip-code", f"estimate --world 1 {MODEL} --window-size 4,0 --window-attn-skip-freq "
        "__import__('os')", "--window-attn-skip-freq", "[1,1,0]")
    add("estimate-window-cp", f"estimate --world 2 {MODEL} --window-size 4,0 --context-parallel-size 2",
        "--window-size", "--context-parallel-size")
    add("estimate-time-0", f"estimate --world 1 {MODEL} --iteration-time 0", "--iteration-time", "above 0")
    add("estimate-time-inf", f"estimate --world 1 {MODEL} --iteration-time inf", "--iteration-time", "finite")
    add("estimate-peak-name", f"estimate --world 1 {MODEL} --iteration-time 1 --peak-tflops b200", "--peak-tflops",
        "h100")
    add("estimate-peak-nan", f"estimate --world 1 {MODEL} --iteration-time 1 --peak-tflops nan", "--peak-tflops")
    add("estimate-peak-no-time", f"estimate --world 1 {MODEL} --peak-tflops 989", "--peak-tflops", "--iteration-time")
    add("estimate-check-time", "estimate --check . --iteration-time 1", "--iteration-time", "--check")
    # --- multi-latent attention -------------------------------------------------------------
    mla = f"{MODEL} --multi-latent-attention --rope-type rope --kv-lora-rank 8 --qk-head-dim 8 --qk-pos-emb-head-dim 4"
    add("mla-gqa", f"pretrain --world 1 {TRAIN} --multi-latent-attention --rope-type rope --group-query-attention "
        "--num-query-groups 1", "--multi-latent-attention", "--group-query-attention")
    add("yarn-positions-mla", f"estimate --world 1 {MODEL} --multi-latent-attention --position-embedding-type yarn",
        "--position-embedding-type yarn", "--multi-latent-attention", "--rope-type yarn")
    add("yarn-flag-alone", f"estimate --world 1 {MODEL} --position-embedding-type rope --yarn-beta-fast 8",
        "--yarn-beta-fast", "--position-embedding-type yarn")
    add("yarn-rotary-percent", f"estimate --world 1 {MODEL} --position-embedding-type yarn --rotary-percent 0.5",
        "--rotary-percent", "yarn")
    add("mla-rope-type-alone", f"estimate --world 1 {MODEL} --rope-type yarn", "--rope-type", "--multi-latent-attention")
    add("mla-q-lora-alone", f"estimate --world 1 {MODEL} --q-lora-rank 8", "--q-lora-rank", "--multi-latent-attention")
    add("mla-cp", f"estimate --world 2 {mla} --context-parallel-size 2", "--multi-latent-attention",
        "--context-parallel-size")
    add("mla-pe-odd", f"estimate --world 1 {mla} --qk-pos-emb-head-dim 3", "--qk-pos-emb-head-dim", "even")
    add("mla-kv-rank-0", f"estimate --world 1 {mla} --kv-lora-rank 0", "--kv-lora-rank")
    add("mla-q-rank-tp", f"estimate --world 2 {mla} --tensor-model-parallel-size 2 --q-lora-rank 5", "--q-lora-rank",
        "--tensor-model-parallel-size")
    add("mla-kv-rank-tp", f"estimate --world 2 {mla} --tensor-model-parallel-size 2 --kv-lora-rank 7",
        "--kv-lora-rank", "divisible")
    return out


DEMO = Path(__file__).resolve().parents[1] / "docs" / "examples" / "launch_demo.py"
ROWS = rows()


# Rows run forked, one child each, as a user's fresh process would be; the rest one after
# another in one torch-free harness (refusals.py: ~5 ms of CPU a row instead of ~20).
FORKED = ("top-unknown-option", "trace-ranks-outside", "pretrain-world-0", "estimate-seq-nan")


@pytest.fixture(scope="module")
def outcomes():
    cases = [Case(argv, env=env, timeout=20, id=cid) for cid, argv, _, env in ROWS]
    found = run_cases([c for c in cases if c.id in FORKED])
    found += run_cases([c for c in cases if c.id not in FORKED], fork=False)
    return {o.case.id: o for o in found}


def test_the_table_is_large_and_unique():
    assert len(ROWS) >= 170, len(ROWS)
    assert len({cid for cid, *_ in ROWS}) == len(ROWS), "two rows share an id"
    assert set(FORKED) <= {cid for cid, *_ in ROWS}


@pytest.mark.parametrize("cid, argv, words, env", ROWS, ids=[row[0] for row in ROWS])
def test_refused_in_one_line_before_torch(outcomes, cid, argv, words, env):
    outcome = outcomes[cid]
    problems = outcome.refusal_problems(must_contain=words)
    assert not problems, f"{problems}\n{outcome.describe()}"


def test_nccl_ranks_are_checked_against_their_gpus(tmp_path, monkeypatch):
    """nccl ranks hold the model on their GPUs: each rank's bytes against its GPU's free memory,
    as nvidia-smi reports it (a stand-in here, so any machine runs the test)."""
    from minitron.cli.common import UserError, validate_pretrain
    from minitron.cli.preflight_memory import check_fits

    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "0, 1000"\necho "1, 81000"\n')   # MiB free on GPU 0 and GPU 1
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    args = validate_pretrain(("--num-layers 2 --hidden-size 4096 --num-attention-heads 32 --seq-length 2048 "
                              "--micro-batch-size 1 --train-iters 2 --lr 1e-3 --mock-data").split(), 2)
    with pytest.raises(UserError, match=r"rank 0 needs [0-9.]+ GiB on its GPU .* the GPU has 1000 MiB free"):
        check_fits(args, "nccl")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")   # both ranks see only the 81,000 MiB GPU: it fits
    check_fits(args, "nccl")
