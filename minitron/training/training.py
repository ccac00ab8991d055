"""pretrain(): the four steps every Megatron training script runs.

    1. initialize_megatron          arguments, globals, process groups, seeds
    2. setup_model_and_optimizer    model_provider on this rank's pipeline stage(s), DDP, optimizer
    3. build_train_valid_test_data_iterators
    4. train                        iterations of train_step

Training counts iterations, not epochs: one iteration is one global batch (num_microbatches x
micro_batch x dp samples) and one optimizer step. With ``--train-iters`` 0 or unset, pretrain
stops after step 1: that is what ``minitron trace`` runs to show a layout's initialization.
"""

from __future__ import annotations

import gc
import os

import torch

from minitron import comm
from minitron.comm.store_barrier import store_barrier
from minitron.comm.timer_slack import slack_timers_for_new_threads
from minitron.core import parallel_state as mpu
from minitron.core.layer_patterns import moe_layer_pattern
from minitron.core.num_microbatches_calculator import get_num_microbatches, update_num_microbatches
from minitron.core.pipeline_parallel import get_forward_backward_func
from minitron.core.pipeline_parallel.schedules import get_model_config
from minitron.core.transformer.moe.moe_logging import logged_losses, track_moe_metrics
from minitron.core.transformer.multi_token_prediction import track_mtp_metrics
from minitron.trace import traced
from minitron.training.global_vars import get_args, get_timers, get_tokenizer, unset_global_variables
from minitron.training.checkpointing import save_checkpoint
from minitron.training.initialize import initialize_megatron
from minitron.training.model_setup import setup_model_and_optimizer
from minitron.training.training_log import IterationLog, print_vocab_padding
from minitron.training.utils import calc_params_l2_norm, print_rank_0, print_rank_last, reduce_losses
from minitron.training.weight_hash import check_param_hashes_across_dp_replicas


INIT_ONLY_ENV = "MINITRON_INIT_ONLY"   # "1": stop after initialize_megatron, whatever the flags' run length


@traced
def pretrain(train_valid_test_dataset_provider, model_provider, model_type, forward_step_func,
             extra_args_provider=None, args_defaults=None, argv=None):
    """Run the four steps; see the module docstring."""
    with slack_timers_for_new_threads():   # gloo's idle threads tick less: comm/timer_slack.py
        initialize_megatron(extra_args_provider=extra_args_provider, args_defaults=args_defaults, argv=argv)
    args = get_args()
    if not args.train_iters or os.environ.get(INIT_ONLY_ENV) == "1":
        # `minitron trace` without --steps sets INIT_ONLY_ENV: a production script's own run
        # length (500,000 iterations of a full-size model) is validated there, never run.
        print_rank_0("> --train-iters is 0: initialization only, no model is built" if not args.train_iters else
                     f"> {INIT_ONLY_ENV}=1: initialization only; the {args.train_iters:,} iterations asked for "
                     "are not run and no model is built")
        # Leave together. new_group returns once *this* rank's connections are up; a rank
        # that exited now could close a socket a slower peer is still completing. (Through
        # the store: a collective would first connect every pair of ranks; see store_barrier.)
        store_barrier()
        return
    # Megatron prints this while building the tokenizer; here it waits until a model is built
    # from the padded size, where a reader comparing layouts needs to see it.
    print_vocab_padding(args, get_tokenizer())
    setup = setup_model_and_optimizer
    if args.deepspeed:  # Megatron-DeepSpeed's path: the engine wraps model and optimizer
        # lazy: only --deepspeed runs load DeepSpeed's engine and ZeRO
        from minitron.training.deepspeed_training import setup_model_and_optimizer as setup
    model, optimizer, opt_param_scheduler = setup(model_provider, model_type)
    try:
        if args.ckpt_convert_format is not None:
            return   # the checkpoint was converted (setup_model_and_optimizer): nothing to train
        # lazy: `minitron trace` (no --train-iters) never builds data iterators
        from minitron.training.data import build_train_valid_test_data_iterators
        train_iter, valid_iter, _ = build_train_valid_test_data_iterators(train_valid_test_dataset_provider)
        train(forward_step_func, model, optimizer, opt_param_scheduler, train_iter, valid_iter)
    finally:
        if not args.deepspeed:
            _unlink_model_config(model)


def _unlink_model_config(model) -> None:
    """Take back the two links from the model's config to what wraps the model, so that the
    model is freed by reference counting alone once pretrain returns.

    setup_model_and_optimizer hands the schedules DDP's no_sync and the optimizer's scale_loss
    through the config, as Megatron does; but every module holds that config, so each link
    closes a cycle (config -> DDP -> module -> config). Such a model, its buffers and its DDP's
    data-parallel groups (gloo's threads) lived on after destroy_global_state, until the cyclic
    collector's next full pass. Megatron needs no such step: its process ends with pretrain."""
    config = get_model_config(model[0])
    config.no_sync_func = config.grad_scale_func = None


def destroy_global_state(world: bool = True) -> None:
    """Forget what initialize_megatron set up (Megatron's name): the globals, every group of
    parallel_state and, with ``world``, the world group itself.

    A program must leave the distributed world before its interpreter exits. Each gloo group
    runs worker threads, and a worker still holds the last reference to a collective the main
    thread has already waited for: it drops it when it next gets the GIL, and dropping a tensor
    Python no longer holds needs the GIL. A worker that asks for the GIL while the interpreter
    is shutting down is ended by it in the middle of a C++ destructor, which is
    "terminate called without an active exception" (SIGABRT): 5 runs in 12 of a 4-rank
    torchrun job here. Destroying a group waits for its work to drain and joins its threads.
    """
    unset_global_variables()
    mpu.destroy_model_parallel()          # the subgroups: parallel_state holds the last reference
    if world and comm.is_initialized():
        comm.destroy_process_group()      # the world (cdb's, and torch's default group)


@traced(args=lambda *a, **k: {"iteration": get_args().curr_iteration})
def train_step(forward_step_func, data_iterator, model, optimizer, opt_param_scheduler):
    """One iteration: all micro-batches forward and backward, gradients reduced, one step."""
    args = get_args()
    if args.deepspeed:  # the engine's loop: minitron/training/deepspeed_training.py
        # lazy: only --deepspeed runs load DeepSpeed's engine and ZeRO
        from minitron.training.deepspeed_training import train_step as deepspeed_train_step
        return deepspeed_train_step(forward_step_func, data_iterator, model, optimizer, opt_param_scheduler)
    for chunk in model:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    losses_reduced = get_forward_backward_func()(
        forward_step_func=forward_step_func, data_iterator=data_iterator, model=model,
        num_microbatches=get_num_microbatches(), seq_length=args.seq_length,
        micro_batch_size=args.micro_batch_size, forward_only=False)
    update_successful, grad_norm, num_zeros_in_grad = optimizer.step()
    if update_successful:
        # The scheduler counts samples, so a ramping batch size moves it at the right pace.
        increment = get_num_microbatches() * args.micro_batch_size * args.data_parallel_size
        opt_param_scheduler.step(increment=increment)
        skipped_iter = 0
    else:
        skipped_iter = 1  # fp16 overflow: the step was skipped on every rank, the scale backed off
    loss = {}
    if mpu.is_pipeline_last_stage(ignore_virtual=True):
        loss = reduce_losses(losses_reduced)
    if args.num_experts is not None and logged_losses(args):   # MoE: every rank joins
        moe = track_moe_metrics(1.0 / get_num_microbatches(), _num_moe_layers(args),
                                args.num_layers + (args.mtp_num_layers or 0), logged_losses(args))
        loss.update(moe if mpu.is_pipeline_last_stage(ignore_virtual=True) else {})
    if args.mtp_num_layers and mpu.is_pipeline_last_stage(ignore_virtual=True):   # its stage's dp groups
        loss.update(track_mtp_metrics(1.0 / get_num_microbatches()))
    return loss, skipped_iter, grad_norm, num_zeros_in_grad


def _num_moe_layers(args) -> int:
    """The decoder's MoE layers, and the multi-token-prediction layers when the last one is MoE
    (they are built like it), as Megatron counts them for the log."""
    pattern = moe_layer_pattern(args.moe_layer_freq, args.num_layers)
    return sum(pattern) + (args.mtp_num_layers or 0) * pattern[-1]


@traced
def train(forward_step_func, model, optimizer, opt_param_scheduler, train_data_iterator,
          valid_data_iterator):
    """Iterate train_step until --train-iters; log, evaluate, count consumed samples."""
    args = get_args()
    timers = get_timers()
    for chunk in model:
        chunk.train()  # dropout on
    log = IterationLog(args)
    iteration = args.iteration
    saved = False
    if args.manual_gc:
        # Megatron's --manual-gc: no collection at a moment the allocator picks, which differs
        # between ranks and stalls a collective for all; collect at the same iterations instead.
        gc.disable()
        gc.collect()
    # --8<-- [start:train-loop]
    while iteration < args.train_iters:
        update_num_microbatches(args.consumed_train_samples, consistency_check=True)
        args.curr_iteration = iteration
        timers("interval-time").start()
        loss, skipped, grad_norm, zeros = train_step(forward_step_func, train_data_iterator, model,
                                                     optimizer, opt_param_scheduler)
        timers("interval-time").stop()
        iteration += 1
        batch_size = mpu.get_data_parallel_world_size() * args.micro_batch_size * get_num_microbatches()
        args.consumed_train_samples += batch_size
        # --8<-- [end:train-loop]
        params_norm = calc_params_l2_norm(model) if args.log_params_norm else None   # every rank: a collective
        log.iteration(iteration, loss, skipped, grad_norm, zeros, optimizer, batch_size,
                      timers("interval-time").elapsed(), params_norm)
        # args.do_valid, not "have I a validation iterator": only tensor-parallel rank 0 reads
        # data, yet every rank must run the evaluation's collectives together.
        if args.eval_interval and args.do_valid and iteration % args.eval_interval == 0:
            evaluate_and_print_results(f"iteration {iteration}", forward_step_func, valid_data_iterator, model)
        interval = getattr(args, "check_weight_hash_across_dp_replicas_interval", None)
        if interval and iteration % interval == 0:   # before a save can keep a corrupted replica
            force_param_sync(model)   # the distributed optimizer's pending shards, gathered first
            check_param_hashes_across_dp_replicas(model, iteration)
        saved = bool(args.save and args.save_interval and iteration % args.save_interval == 0)
        if saved:
            force_param_sync(model)
            save_checkpoint(iteration, model, optimizer, opt_param_scheduler)
        if args.manual_gc and args.manual_gc_interval and iteration % args.manual_gc_interval == 0:
            gc.collect()
        if args.exit_interval and iteration % args.exit_interval == 0:
            break  # a planned stop (a job's time slot ends): the checkpoint below resumes it
    force_param_sync(model)   # training is over: no next forward will gather the last step's shards
    if args.save and not saved:
        save_checkpoint(iteration, model, optimizer, opt_param_scheduler)  # always keep the end
    args.iteration = iteration
    log.close()
    if args.manual_gc:
        gc.enable()   # ours: Megatron's process ends here; a test's or notebook's goes on
    return iteration


def force_param_sync(model) -> None:
    """--overlap-param-gather leaves each step's updated shards to the next forward's pre-hooks.
    A checkpoint, or the end of training, needs whole parameters now: gather every bucket."""
    if get_args().overlap_param_gather:
        for chunk in model:
            chunk.start_param_sync(force_sync=True)


@traced
def evaluate(forward_step_func, data_iterator, model, eval_iters: int) -> dict:
    """Forward only, no gradients, over eval_iters global batches; mean of each loss."""
    args = get_args()
    if args.deepspeed and model[0].runs_pipelines:   # the PipelineEngine's InferenceSchedule
        # lazy: only --deepspeed runs load DeepSpeed's engine
        from minitron.training.deepspeed_training import evaluate_pipeline
        return evaluate_pipeline(data_iterator, model[0], eval_iters)
    for chunk in model:
        chunk.eval()
    reports = []
    # As Megatron: an evaluation's batch is --eval-global-batch-size in --eval-micro-batch-size
    # pieces (the training's final sizes unless given), whatever a batch-size ramp is at.
    micro = getattr(args, "eval_micro_batch_size", None) or args.micro_batch_size
    batch = getattr(args, "eval_global_batch_size", None) or args.global_batch_size
    num_microbatches = batch // (micro * mpu.get_data_parallel_world_size())
    with torch.no_grad():
        for _ in range(eval_iters):
            reports += get_forward_backward_func()(
                forward_step_func=forward_step_func, data_iterator=data_iterator, model=model,
                num_microbatches=num_microbatches, seq_length=args.seq_length,
                micro_batch_size=micro, forward_only=True)
    for chunk in model:
        chunk.train()
    return reduce_losses(reports) if reports else {}


def evaluate_and_print_results(prefix, forward_step_func, data_iterator, model):
    args = get_args()
    manual_gc = args.manual_gc and args.manual_gc_eval
    if manual_gc:
        gc.collect()   # as Megatron: the evaluation starts, and below ends, with a collection
    results = evaluate(forward_step_func, data_iterator, model, args.eval_iters)
    if manual_gc:
        gc.collect()
    if mpu.is_pipeline_last_stage(ignore_virtual=True):
        text = " | ".join(f"{k} value: {v:.6E}" for k, v in results.items())
        print_rank_last(f" validation loss at {prefix} | {text}")
    return results
