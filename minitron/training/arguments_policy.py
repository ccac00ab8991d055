"""What minitron does with a Megatron flag it does not implement: the policy.

Megatron's example launch scripts (examples/gpt3, examples/llama, examples/mixtral) pass 25 to
94 flags each. Many of them choose *how* a step runs on a GPU, not *what* it computes: a fused
kernel, an attention backend, a logger, a profiler. minitron runs plain torch ops in order and
computes the same numbers either way, so such a flag is **accepted and listed once**, with the
reason it changes nothing here, in the run's header (rank 0, where Megatron prints its
arguments; and `minitron trace` / `estimate`).

A flag that changes the math (fp8 weights, another learning-rate or batch-size schedule) cannot
be accepted silently: the run would not be the one asked for. It is **refused by name**, with
the reason and what to use instead, while parsing — before any process starts.

Everything else is either a flag minitron implements (argument_groups.py) or unknown, and an
unknown flag is refused by argparse as usual.
"""

from __future__ import annotations

import argparse

_FUSION = "a kernel fusion; minitron runs the unfused torch ops, which compute the same"
# Megatron turns these three fusions on by default; the flag turns one off, which is minitron's default.
_OPT_IN_FUSION = ("turns off a fusion that Megatron turns on by default; minitron's default is already the "
                  "unfused torch ops (its opt-in is the flag without --no-)")
_LOGGER = "a logger minitron lacks; its log is stdout, --log-jsonl and the trace"
_PROFILER = "the GPU profiler; minitron's trace records every step instead"
_ATTENTION = "chooses the attention kernel; minitron's is torch's"

_CKPT_WRITER = ("writes the checkpoint from a background process while training goes on; minitron writes the "
                "same files before the next step")
# Megatron's choices for --dist-ckpt-strictness (its CheckpointConfig), checked here as there.
_STRICTNESS = ("assume_ok_unexpected", "log_unexpected", "log_all", "raise_unexpected", "raise_all",
               "return_unexpected", "return_all", "ignore_all")

# flag: (takes a value -- False, True, or the tuple of values it takes --, why it changes nothing here)
NO_EFFECT = {
    "--use-mcore-models": (False, "minitron's one GPT is Megatron-Core's GPTModel"),
    "--transformer-impl": (True, "chooses Transformer Engine's or the local layers; minitron's are local"),
    "--attention-backend": (True, _ATTENTION),
    "--use-flash-attn": (False, _ATTENTION),
    "--no-masked-softmax-fusion": (False, _FUSION),
    "--no-bias-gelu-fusion": (False, _OPT_IN_FUSION),
    "--no-bias-swiglu-fusion": (False, _OPT_IN_FUSION),
    "--no-bias-dropout-fusion": (False, _OPT_IN_FUSION),
    "--no-rope-fusion": (False, _FUSION),
    "--no-gradient-accumulation-fusion": (False, _FUSION),
    "--no-persist-layer-norm": (False, _FUSION),
    "--moe-shared-expert-overlap": (False, "runs the shared experts while the tokens travel; the same sum"),
    "--delay-wgrad-compute": (False, "computes each weight gradient later in the backward, so that it overlaps the "
                              "experts' all-to-all (Transformer Engine's split wgrad); the same gradients, "
                              "which minitron computes in order"),
    "--tensorboard-dir": (True, _LOGGER),
    "--tensorboard-log-interval": (True, _LOGGER),
    "--log-timers-to-tensorboard": (False, _LOGGER),
    "--wandb-project": (True, _LOGGER),
    "--wandb-exp-name": (True, _LOGGER),
    "--wandb-save-dir": (True, _LOGGER),
    "--profile": (False, _PROFILER),
    "--profile-step-start": (True, _PROFILER),
    "--profile-step-end": (True, _PROFILER),
    "--profile-ranks": (True, _PROFILER),
    "--record-memory-history": (False, "snapshots the CUDA allocator's history for its memory viewer; minitron's "
                                       "memory lines and `estimate` show the bytes instead"),
    "--use-nccl-ub": (False, "registers the communication buffers with NCCL (user buffers), which frees GPU SMs "
                             "for compute; the same sums"),
    "--fsdp-double-buffer": (False, "reuses two Megatron-FSDP communication buffers instead of allocating per "
                                    "gather: memory management only"),
    "--fsdp-manual-registration": (False, "registers Megatron-FSDP's buffers with NCCL by hand (needs "
                                          "--use-nccl-ub): GPU memory registration only"),
    "--empty-unused-memory-level": (True, "when the CUDA allocator's cache is emptied: memory only"),
    "--no-mmap-bin-files": (False, "how the .bin file is read; the same tokens"),
    "--exit-duration-in-mins": (True, "a wall-clock stop for a cluster's time limit: no step computes anything "
                                      "else; a run here ends at --train-iters or --exit-interval"),
    "--export-force-local-attention": (False, "chooses the local attention layers over Transformer Engine's "
                                              "(for export); minitron's are local"),
    "--moe-permute-fusion": (False, _FUSION),
    "--use-fused-weighted-squared-relu": (False, "relu(x)^2 times the routing weight in one kernel (Transformer "
                                                  "Engine's grouped experts); minitron's experts compute the same "
                                                  "product unfused (the weight's place: walkthrough chapter 22)"),
    "--use-transformer-engine-op-fuser": (False, "Transformer Engine's operation fuser for the MLP; " + _FUSION),
    "--te-rng-tracker": (False, "Transformer Engine's RNG tracker; minitron's own (tensor_parallel/random.py) "
                                "keeps the same per-rank streams apart"),
    "--moe-per-layer-logging": (False, _LOGGER),
    "--attention-softmax-in-fp32": (False, "minitron's attention already takes the softmax in fp32 "
                                           "(attention.py casts the scores up)"),
    # What Megatron's CI and launch scripts pass everywhere (issue #36).
    "--log-memory-to-tensorboard": (False, _LOGGER),
    "--log-validation-ppl-to-tensorboard": (False, _LOGGER),
    "--async-save": (False, _CKPT_WRITER),
    "--use-persistent-ckpt-worker": (False, "keeps --async-save's background writer alive between saves; "
                                            "minitron has no background writer"),
    "--dist-ckpt-strictness": (_STRICTNESS, "what a torch_dist load does with keys the checkpoint and the model "
                                            "do not share; minitron's load refuses a missing key and ignores an "
                                            "extra one (Megatron's default, assume_ok_unexpected) whatever it says"),
    "--nvtx-ranges": (False, _PROFILER),
    "--cross-entropy-fusion-impl": (("native", "te"), "chooses whose kernel --cross-entropy-loss-fusion runs "
                                                      "(Megatron's or Transformer Engine's); minitron's is its own"),
    "--disable-gloo-process-groups": (False, "skips the gloo twins of the data-parallel groups; minitron "
                                             "builds them, as Megatron does, but nothing here sends through them"),
    "--enable-experimental": (False, "unlocks Megatron's experimental code paths; minitron implements none of them"),
    "--dist-ckpt-optim-fully-reshardable": (False, "minitron's torch_dist already saves the optimizer state shaped "
                                                   "like the parameters, which any tp, pp, ep and dp resumes"),
}

_FP8_WGRAD = ("computes the weight gradient from the unquantized input and output gradient (TE's "
              "override_linear_precision); minitron's fp8 weight gradient is always fp8: drop it")

_INJECTION = ("corrupts results on purpose, to exercise Megatron's rerun state machine (--rerun-mode), which "
              "minitron lacks: drop it")

# flag: (takes a value, why it is refused and what to do instead)
REFUSED = {
    "--error-injection-rate": (True, _INJECTION),
    "--error-injection-type": (True, _INJECTION),
    "--no-fp8-wgrad": (False, _FP8_WGRAD),
    "--disable-fp8-wgrad": (False, _FP8_WGRAD),
}


class _NoEffect(argparse.Action):
    """Remember the flag (in ``args.no_effect``, once, in the order given); compute nothing."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = list(getattr(namespace, self.dest) or ())   # a new list: the default is shared
        if option_string not in given:
            given.append(option_string)
        setattr(namespace, self.dest, given)


class _Refused(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is refused: {REFUSED[option_string][1]}")


def add_policy_args(parser) -> None:
    """Megatron's flags that minitron accepts without effect, or refuses by name."""
    g = parser.add_argument_group("accepted, no effect here")
    for flag, (value, why) in NO_EFFECT.items():
        choices = value if isinstance(value, tuple) else None   # checked as Megatron checks them
        g.add_argument(flag, dest="no_effect", action=_NoEffect, nargs=1 if value else 0, default=None,
                       choices=choices, help=f"no effect here: {why}")
    g = parser.add_argument_group("refused (they change the math and cannot run here)")
    for flag, (value, why) in REFUSED.items():
        g.add_argument(flag, dest="refused", action=_Refused, nargs=1 if value else 0,
                       default=argparse.SUPPRESS, help=why)


def note_no_effect(args, *notes: str) -> None:
    """Add ``notes`` to the header's no-effect list (``args.no_effect_notes``, which
    no_effect_lines prints): the one way validate_args' checks record a part they accept but
    cannot honour."""
    args.no_effect_notes = [*(getattr(args, "no_effect_notes", None) or ()), *notes]


def no_effect_lines(args) -> list[str]:
    """One header line per accepted-without-effect flag the command line gave, then one per part
    of an implemented flag that minitron cannot honour (validate_args notes them in
    ``args.no_effect_notes``: a --recompute-modules entry, say)."""
    given = getattr(args, "no_effect", None) or ()   # None: no such flag (or args from an older trace)
    lines = [f"accepted, no effect here: {flag}: {NO_EFFECT[flag][1]}" for flag in given]
    return lines + [f"accepted, no effect here: {note}" for note in getattr(args, "no_effect_notes", None) or ()]
