"""``pretrain --deepspeed``: Megatron-DeepSpeed's path through pretrain(), where DeepSpeed's engine
(minitron.runtime) takes the places of DDP and of Megatron's optimizer wrapper.

What changes against Megatron's own path (training.py, model_setup.py):

    setup_model_and_optimizer   the model is built bare (no DDP, no Float16Module); the torch
                                optimizer over Megatron's param groups and Megatron's schedule
                                are built as usual and handed to ``initialize(...)`` with
                                ``mpu=parallel_state``, so the engine reduces over the
                                data-parallel group and measures norms over the tensor group
    train_step                  each micro-batch: forward, then ``engine.backward(loss)``, which
                                divides by the accumulation steps itself (Megatron's schedule
                                divides by the number of micro-batches; here it must not, or
                                the loss would be divided twice); then one ``engine.step()``
                                per global batch, the boundary set by hand, as
                                Megatron-DeepSpeed's schedules do
    save / load_checkpoint      the engine's own, in DeepSpeed's layout, with the iteration, the
                                consumed samples and the RNG states as its client state
                                (checkpointing.py)

With a pipeline (--pipeline-model-parallel-size > 1) the model is built as a PipelineModule
(gpt_model_pipe.py), ``initialize`` returns DeepSpeed's PipelineEngine (runtime/pipe/), and
train_step is one ``engine.train_batch(data_iterator)``: the engine's instruction stream runs the
micro-batches, the reductions and the step, so forward_step is not called on this path (the
PipelineModule's loss_fn plays loss_func's part, ``get_batch_pipe`` get_batch's).

What does not change: the model's weights and numbers, the data, the log line.
The two counts agree because validate_args refused any ds_config whose triad differs from
--micro-batch-size / --global-batch-size (deepspeed_arguments.py): gradient_accumulation_steps
is the number of micro-batches.
"""

from __future__ import annotations

from minitron.core import parallel_state as mpu
from minitron.core.num_microbatches_calculator import get_num_microbatches
from minitron.core.pipeline_parallel.schedules import forward_step_calc_loss
from minitron.core.optimizer import OptimizerConfig, _get_param_groups, _make_torch_optimizer
from minitron.runtime import initialize
from minitron.runtime.zero import register_external_parameter
from minitron.trace import traced
from minitron.training.checkpointing import load_checkpoint
from minitron.training.arguments import core_transformer_config_from_args
from minitron.training.global_vars import get_args
from minitron.training.gpt_model_pipe import gpt_model_pipe
from minitron.training.model_setup import get_model, get_optimizer_param_scheduler
from minitron.training.utils import get_batch, reduce_losses


def _register_tied_weight(model) -> None:
    """With embedding and output tied on one stage, the output layer reads a matrix the
    embedding owns; ZeRO-3 must gather it for the output layer too (see zero/stage3.py)."""
    if getattr(model, "share_embeddings_and_output_weights", False) and model.pre_process and model.post_process:
        register_external_parameter(model.output_layer, model.shared_embedding_or_output_weight())


def get_batch_pipe(data: dict | None):
    """Megatron-DeepSpeed's batch function: one micro-batch from the data loader as the pair
    LoadMicroBatch wants, ((tokens, position_ids), (labels, loss_mask)); get_batch keeps for
    each stage its own keys (the first stage's inputs, the last stage's labels)."""
    tokens, labels, loss_mask, _, position_ids = get_batch(iter((data,)))
    return (tokens, position_ids), (labels, loss_mask)


def _pipeline_model(args):
    """Megatron-DeepSpeed's model_provider builds GPTModelPipe under --deepspeed with a
    pipeline; here the --deepspeed path makes that choice, so pretrain_gpt.py stays Megatron's."""
    model = gpt_model_pipe(core_transformer_config_from_args(args), args.padded_vocab_size,
                           args.max_position_embeddings, not args.untie_embeddings_and_output_weights,
                           args.pipeline_model_parallel_size, args.data_parallel_size)
    if model.stage_id != mpu.get_pipeline_model_parallel_rank():   # one rank order for both views
        raise RuntimeError(f"DeepSpeed's topology puts rank {model.global_rank} at stage {model.stage_id}, "
                           f"Megatron's groups at stage {mpu.get_pipeline_model_parallel_rank()}")
    return [model]


@traced
def setup_model_and_optimizer(model_provider_func, model_type):
    args = get_args()
    pipelined = args.pipeline_model_parallel_size > 1
    model = _pipeline_model(args) if pipelined else get_model(model_provider_func, model_type, wrap_with_ddp=False)
    config = OptimizerConfig(optimizer=args.optimizer, lr=args.lr, min_lr=args.min_lr,
                             weight_decay=args.weight_decay, adam_beta1=args.adam_beta1,
                             adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
                             sgd_momentum=args.sgd_momentum)
    # The bare torch optimizer (Megatron-DeepSpeed's get_megatron_optimizer returns it unwrapped
    # under --deepspeed): the engine wraps it in ZeRO's optimizer instead of Megatron's.
    optimizer = _make_torch_optimizer(config, _get_param_groups(model))
    opt_param_scheduler = get_optimizer_param_scheduler(optimizer)
    _register_tied_weight(model[0])
    # A PipelineModule brings its own grid as the mpu (DeepSpeed asserts that none is passed).
    engine, optimizer, _, opt_param_scheduler = initialize(
        model=model[0], optimizer=optimizer, args=args, lr_scheduler=opt_param_scheduler,
        mpu=None if pipelined else mpu, config=args.deepspeed_config)
    if pipelined:
        engine.set_batch_fn(get_batch_pipe)
    if engine.gradient_accumulation_steps() != get_num_microbatches():   # validate_args made sure
        raise RuntimeError(f"the ds_config accumulates {engine.gradient_accumulation_steps()} "
                           f"micro-batches, Megatron's batch flags make {get_num_microbatches()}")
    args.iteration = 0
    args.consumed_train_samples = 0
    if args.load is not None:   # the engine's load_checkpoint, with the client state (checkpointing.py)
        args.iteration = load_checkpoint([engine], optimizer, opt_param_scheduler)
    return [engine], optimizer, opt_param_scheduler


@traced(args=lambda *a, **k: {"iteration": get_args().curr_iteration})
def train_step(forward_step_func, data_iterator, model, optimizer, opt_param_scheduler):
    """One iteration through the engine: every micro-batch forward and engine.backward, then
    one engine.step() that applies the update (or skips it on an fp16 overflow)."""
    args = get_args()
    engine = model[0]
    num_microbatches = get_num_microbatches()
    increment = num_microbatches * args.micro_batch_size * args.data_parallel_size
    if engine.runs_pipelines:   # the whole batch is one instruction stream (runtime/pipe/engine.py)
        loss = engine.train_batch(data_iter=data_iterator, lr_kwargs={"increment": increment})
        applied = engine.was_step_applied()
        grad_norm = engine.get_global_grad_norm() if applied else None
        return {"lm loss": float(loss)}, int(not applied), grad_norm, None
    losses_reduced = []
    for i in range(num_microbatches):
        # Only the last backward is a boundary: ZeRO 0/1 reduce there, ZeRO 2/3 every time.
        engine.set_gradient_accumulation_boundary(i == num_microbatches - 1)
        losses_reduced.append(forward_backward_step(forward_step_func, data_iterator, engine, i))
    engine.step(lr_kwargs={"increment": increment})   # the schedule counts samples, as Megatron's
    applied = engine.was_step_applied()
    grad_norm = engine.get_global_grad_norm() if applied else None
    return reduce_losses(losses_reduced), int(not applied), grad_norm, None


@traced(args=lambda forward_step_func, data_iterator, engine, i: {"microbatch": i})
def forward_backward_step(forward_step_func, data_iterator, engine, i: int) -> dict:
    """One micro-batch: the model's forward through the engine (ZeRO-3 gathers each module's
    weights here), the loss, and engine.backward (scaled, divided by the accumulation steps,
    gradients reduced as the stage says)."""
    output_tensor, loss_func = forward_step_func(data_iterator, engine)
    reduced = []
    # Megatron's normalisation (the mean over the micro-batch's tokens), with one micro-batch and
    # no context parallelism: the engine divides by its accumulation steps itself. No config:
    # the MoE aux-loss scale is Megatron's schedules' business, not the engine's.
    loss, _ = forward_step_calc_loss(output_tensor, loss_func, None, None, 1, reduced,
                                     cp_group_size=1, is_last_stage=True)
    engine.backward(loss)
    return reduced[0]


def evaluate_pipeline(data_iterator, engine, eval_iters: int) -> dict:
    """Megatron-DeepSpeed's evaluate with a pipeline: ``eval_iters`` calls of eval_batch (the
    InferenceSchedule's stream, no gradients), each the mean loss of one global batch."""
    losses = [float(engine.eval_batch(data_iterator)) for _ in range(eval_iters)]
    return {"lm loss": sum(losses) / len(losses)}
