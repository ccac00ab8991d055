"""Process-wide singletons: the parsed args, timers, tokenizer, and the micro-batch calculator.

Megatron reaches these through getters (``get_args()``) instead of passing them down every
call chain; set_global_variables fills them once, right after validate_args.
"""

from __future__ import annotations

from minitron.core.num_microbatches_calculator import (destroy_num_microbatches_calculator,
                                                       init_num_microbatches_calculator)
from minitron.core.timers import Timers
from minitron.trace import traced
from minitron.training.tokenizer import build_tokenizer as _make_tokenizer

_GLOBAL_ARGS = None
_GLOBAL_TOKENIZER = None
_GLOBAL_TIMERS = None
_GLOBAL_TENSORBOARD_WRITER = None


def get_args():
    assert _GLOBAL_ARGS is not None, "args are not initialized: call initialize_megatron first"
    return _GLOBAL_ARGS


def get_tokenizer():
    assert _GLOBAL_TOKENIZER is not None, "tokenizer is not initialized"
    return _GLOBAL_TOKENIZER


def get_timers():
    assert _GLOBAL_TIMERS is not None, "timers are not initialized"
    return _GLOBAL_TIMERS


def get_tensorboard_writer():
    """None: minitron logs to the terminal and --log-jsonl instead of TensorBoard."""
    return _GLOBAL_TENSORBOARD_WRITER


def _recorded_args(args, build_tokenizer: bool = True) -> dict:
    """The trace keeps the validated arguments (`minitron estimate --check` and `diff` read them)."""
    plain = (int, float, str, bool, type(None))
    return {"args": {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in vars(args).items()
                     if isinstance(v, plain) or isinstance(v, (list, tuple)) and all(isinstance(x, plain) for x in v)}}


@traced(args=_recorded_args)
def set_global_variables(args, build_tokenizer: bool = True):
    """Megatron's order: args, the micro-batch calculator, the tokenizer, then the rest."""
    global _GLOBAL_ARGS, _GLOBAL_TIMERS
    _GLOBAL_ARGS = args
    init_num_microbatches_calculator(
        args.rank, args.rampup_batch_size, args.global_batch_size,
        args.micro_batch_size, args.data_parallel_size,
        # Megatron passes the sequence length: the schedule's thresholds count tokens.
        step_batch_size_schedule=args.step_batch_size_schedule, seq_length=args.seq_length,
    )
    if build_tokenizer and args.tokenizer_type is not None:
        _build_tokenizer(args)
    _GLOBAL_TIMERS = Timers(log_level=args.timing_log_level)


@traced
def _build_tokenizer(args):
    """Build the tokenizer and keep it (it also sets args.padded_vocab_size, which the model's
    embedding and output layer are sized by)."""
    global _GLOBAL_TOKENIZER
    _GLOBAL_TOKENIZER = _make_tokenizer(args)
    return _GLOBAL_TOKENIZER


def unset_global_variables():
    """Forget everything (the fake backend replays initialisation once per simulated rank)."""
    global _GLOBAL_ARGS, _GLOBAL_TOKENIZER, _GLOBAL_TIMERS
    _GLOBAL_ARGS = _GLOBAL_TOKENIZER = _GLOBAL_TIMERS = None
    destroy_num_microbatches_calculator()
