"""``--deepspeed --deepspeed-config ds.json``: what must hold between the ds_config and Megatron's
flags, checked in validate_args, before any rank starts (torch-free, like the rest of it).

Megatron-DeepSpeed hands one model, one optimizer and one schedule to ``deepspeed.initialize``
and then lets two descriptions of the same run coexist: Megatron's flags and the ds_config.
Where both speak of the same number they must say the same thing, or the run is not the one
either describes:

    batch      the config's triad, resolved at this run's data-parallel size, against
               --micro-batch-size / --global-batch-size (DeepSpeed derives the accumulation
               steps from it; Megatron derives the number of micro-batches from its flags)
    precision  fp16 / bf16 in the config against --fp16 / --bf16 (Megatron builds the
               weights in that type before the engine sees them)
    optimizer  Megatron's flags build it and its schedule, as in Megatron-DeepSpeed, where
               the client's optimizer wins and the config's "optimizer"/"scheduler" are
               silently dropped; here such a section is refused rather than dropped

and the layouts the engine does not run are refused by name. A --load must hold the engine's
files for this run's ZeRO stage, precision and sizes (check_deepspeed_load). What the config alone decides:
the ZeRO stage, gradient_clipping (Megatron's --clip-grad is not read on this path, as in
Megatron-DeepSpeed), the fp16 loss-scale settings.
"""

from __future__ import annotations

from pathlib import Path

from minitron.training.argument_groups import ArgumentError
from minitron.training.deepspeed_activation_arguments import validate_activation_checkpointing


def _refuse_layout(args) -> None:
    """The engine runs tensor and data parallelism; everything else has a reason to stop."""
    pp = args.pipeline_model_parallel_size
    refusals = [
        (pp > 1 and args.tensor_model_parallel_size > 1,
         f"--pipeline-model-parallel-size {pp} with --tensor-model-parallel-size {args.tensor_model_parallel_size} "
         "and --deepspeed: minitron's PipelineModule GPT has no tensor-parallel layers; drop one of the two"),
        (pp > 1 and args.virtual_pipeline_model_parallel_size is not None,
         "--num-layers-per-virtual-pipeline-stage with --deepspeed: DeepSpeed's TrainSchedule has one "
         "chunk per stage; drop the flag"),
        (pp > 1 and args.position_embedding_type == "rope",
         "--position-embedding-type rope with --deepspeed and a pipeline: minitron's PipelineModule GPT has "
         "learned absolute positions only; use learned_absolute or pipeline size 1"),
        (pp > 1 and (args.reset_attention_mask or args.reset_position_ids),
         "--reset-attention-mask / --reset-position-ids with --deepspeed and a pipeline: its layers run "
         "plain causal attention; drop the flag or use pipeline size 1"),
        (pp > 1 and args.recompute_granularity is not None,
         "--recompute-granularity with --deepspeed and a pipeline: DeepSpeed's activation checkpointing "
         "is not built here; drop the flag"),
        (pp > 1 and (args.save is not None or args.load is not None),
         "--save / --load with --deepspeed and a pipeline: DeepSpeed's per-layer checkpoint files are not "
         "built here; drop them or use pipeline size 1"),
        (args.context_parallel_size > 1, f"--context-parallel-size {args.context_parallel_size} with --deepspeed: "
                                         "the engine reduces gradients over the data-parallel group only; drop one"),
        (args.sequence_parallel, "--sequence-parallel with --deepspeed: its layernorm gradients need a "
                                 "tensor-parallel all-reduce the engine does not do; drop one"),
        (args.use_distributed_optimizer, "--use-distributed-optimizer with --deepspeed: ZeRO partitions the "
                                         "optimizer there (zero_optimization.stage >= 1); drop the flag"),
        (args.overlap_grad_reduce, "--overlap-grad-reduce with --deepspeed: the engine reduces the gradients "
                                   "there; set zero_optimization.overlap_comm in the ds_config and drop the flag"),
        (args.expert_model_parallel_size > 1 or args.num_experts,
         "--num-experts / --expert-model-parallel-size with --deepspeed: the engine has no expert groups; drop one"),
        (args.mtp_num_layers, "--mtp-num-layers with --deepspeed: the engine scales only the loss it is handed, "
                              "not the MTP losses hung on the hidden states, and its PipelineModule GPT has no "
                              "MTP layers; drop one"),
        (args.rampup_batch_size is not None, "--rampup-batch-size with --deepspeed: the ds_config's "
                                             "train_batch_size is fixed; drop the ramp-up"),
        (args.step_batch_size_schedule is not None, "--step-batch-size-schedule with --deepspeed: the ds_config's "
                                                    "train_batch_size is fixed; drop the schedule"),
        (args.calculate_per_token_loss, "--calculate-per-token-loss with --deepspeed: the engine divides the loss "
                                        "by its accumulation steps, not by the global batch's tokens; drop one"),
        (args.decoupled_lr is not None, "--decoupled-lr with --deepspeed: the engine's optimizer has no group of "
                                        "its own for the embedding; drop one"),
    ]
    for refused, message in refusals:
        if refused:
            raise ArgumentError(message)


def validate_deepspeed_args(args):
    """Refuse a --deepspeed run whose ds_config and flags disagree; returns the resolved config."""
    if not args.deepspeed:
        if args.deepspeed_config is not None:
            raise ArgumentError(f"--deepspeed-config {args.deepspeed_config} is read only with --deepspeed: "
                                "add --deepspeed, or drop the config")
        if args.deepspeed_activation_checkpointing:
            raise ArgumentError("--deepspeed-activation-checkpointing configures DeepSpeed's checkpoint, used only "
                                "with --deepspeed: add --deepspeed --deepspeed-config ds.json, or drop it")
        return None
    if args.deepspeed_config is None:
        raise ArgumentError("--deepspeed needs --deepspeed-config ds.json (the ds_config: batch triad, "
                            "zero_optimization, precision)")
    _refuse_layout(args)
    from minitron.runtime import DeepSpeedConfig, DeepSpeedConfigError  # torch-free

    path, dp = args.deepspeed_config, args.data_parallel_size
    try:
        config = DeepSpeedConfig(path, world_size=dp)
    except DeepSpeedConfigError as exc:
        text = str(exc)
        prefix = "--deepspeed-config " if text.startswith(str(path)) else f"--deepspeed-config {path}: "
        raise ArgumentError(prefix + text) from None
    for section in ("optimizer", "scheduler"):
        if config.as_dict()[section]["type"] is not None:
            raise ArgumentError(f"--deepspeed-config {path} has a section {section!r}: with pretrain, Megatron's "
                                "flags (--lr, --weight-decay, --lr-decay-style, ...) build the optimizer and its "
                                "schedule, as in Megatron-DeepSpeed; drop the section")
    _check_triad(args, config, path, dp)
    _check_zeropp(args, config, path, dp)
    _check_offload(args, config, path)
    validate_activation_checkpointing(args, config.activation_checkpointing_config, path)
    if args.pipeline_model_parallel_size > 1 and config.zero_optimization_stage >= 2:
        raise ArgumentError(f"--deepspeed-config {path}: zero_optimization.stage {config.zero_optimization_stage} "
                            "with --pipeline-model-parallel-size "
                            f"{args.pipeline_model_parallel_size}: DeepSpeed's PipelineEngine runs ZeRO stage 0 or "
                            "1 only (stages 2 and 3 split gradients the pipeline accumulates); use stage 0 or 1")
    if args.load is not None:
        check_deepspeed_load(args.load, config.zero_optimization_stage, config.bfloat16_enabled,
                             args.tensor_model_parallel_size, dp, config.load_universal_checkpoint)
    for key, flag, enabled in (("fp16", "--fp16", config.fp16_enabled), ("bf16", "--bf16", config.bfloat16_enabled)):
        if enabled != bool(getattr(args, key)):
            said = "enables" if enabled else "does not enable"
            raise ArgumentError(f"--deepspeed-config {path} {said} {key} but {flag} is "
                                f"{'not ' if enabled else ''}given: make them agree")
    return config


def _check_offload(args, config, path) -> None:
    """ZeRO-Offload under pretrain: Megatron's flags build a torch optimizer and hand it to the
    engine as a client optimizer, which DeepSpeed refuses to step offloaded states unless told;
    states swapped to NVMe are not saved or loaded by minitron's checkpoints."""
    offload = config.zero_config.offload_optimizer
    if offload is None or offload.device == "none":
        return
    if config.zero_force_ds_cpu_optimizer:
        raise ArgumentError(f"--deepspeed-config {path}: offload_optimizer with pretrain's own (client) optimizer: "
                            "DeepSpeed refuses it unless the config says \"zero_force_ds_cpu_optimizer\": false; "
                            "add that")
    if offload.device == "nvme" and config.zero_optimization_stage == 3 and (args.save or args.load):
        raise ArgumentError(f"--deepspeed-config {path}: checkpoints of states swapped to NVMe are not built in "
                            "minitron; drop --save/--load or use offload_optimizer.device \"cpu\"")


def _check_zeropp(args, config, path, dp: int) -> None:
    """ZeRO++'s groups are cut from world ranks (DeepSpeed's _create_zero_param_parallel_group,
    _get_local_all_to_all_group): refused, before any rank starts, where data parallelism is
    not the whole world or hpZ's size does not divide it."""
    z3 = config.zero_config.stage3
    if config.zero_optimization_stage != 3 or not (z3.zero_hpz_partition_size > 1 or z3.zero_quantized_gradients):
        return
    key = "zero_hpz_partition_size" if z3.zero_hpz_partition_size > 1 else "zero_quantized_gradients"
    if dp != args.world_size:
        raise ArgumentError(f"--deepspeed-config {path}: {key} needs data parallelism over every rank (DeepSpeed "
                            f"builds its groups from world ranks), here {dp} of {args.world_size}; drop it or the "
                            "model parallelism")
    if z3.zero_hpz_partition_size > 1 and dp % z3.zero_hpz_partition_size:
        raise ArgumentError(f"--deepspeed-config {path}: zero_hpz_partition_size {z3.zero_hpz_partition_size} "
                            f"must divide the {dp} ranks (a node's worth of them)")


def _check_triad(args, config, path, dp: int) -> None:
    """The two batch sizes both sides name; the accumulation steps then agree by arithmetic
    (the config's triad was checked whole: train = micro x steps x dp)."""
    pairs = (("train_micro_batch_size_per_gpu", config.train_micro_batch_size_per_gpu,
              "--micro-batch-size", args.micro_batch_size),
             ("train_batch_size", config.train_batch_size, "--global-batch-size", args.global_batch_size))
    for key, theirs, flag, ours in pairs:
        if theirs != ours:
            raise ArgumentError(
                f"--deepspeed-config {path}: {key} is {theirs} but {flag} is {ours} (at data-parallel size "
                f"{dp}): make them equal, e.g. {key}: {ours} in the ds_config")


def _engine_files(stage: int, bf16: bool, tp: int, dp: int) -> set:
    """The files the engine's load_checkpoint reads across all ranks (runtime/checkpoint's names;
    pp is 1 on this path, so DeepSpeed's mp rank is the tensor rank)."""
    from minitron.runtime.checkpoint import constants as C   # torch-free; the package only when needed

    model = C.MODEL_FILE_PREFIX + "{t:02d}" + C.MODEL_FILE_SUFFIX
    names = {(C.ZERO_FILE_PREFIX + "{d}_" + model if stage == 3 else model).format(d=d, t=t)
             for d in range(dp) for t in range(tp)}
    if stage >= 1:
        prefix = C.BF16_ZERO_FILE_PREFIX if bf16 else C.ZERO_FILE_PREFIX
        names |= {f"{prefix}{d}_{C.MODEL_FILE_PREFIX}{t:02d}{C.OPTIM_FILE_SUFFIX}" for d in range(dp) for t in range(tp)}
    return names


def check_deepspeed_load(root, stage: int, bf16: bool, tp: int, dp: int, universal: bool = False) -> None:
    """Before any rank starts: does the tag ``latest`` names hold exactly the files this run's
    ranks will read? A ZeRO partition fits only the stage, precision and sizes that cut it, so
    any other file set is a checkpoint of another layout. No ``latest`` at all is no checkpoint
    yet (the engine returns None, and Megatron-DeepSpeed starts from scratch). A universal
    checkpoint (the ds_config's checkpoint.load_universal) fits any stage and size: see
    _check_universal_load."""
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise ArgumentError(f"--load {root} is a file: give the directory a --deepspeed --save wrote (it holds 'latest')")
    if universal:
        return _check_universal_load(root, tp)
    latest = root / "latest"
    if not latest.is_file():
        if (root / "latest_checkpointed_iteration.txt").is_file():   # Megatron's marker alone
            raise ArgumentError(f"--load {root} holds Megatron's layout (no DeepSpeed 'latest'), which the engine "
                                "does not read: resume it without --deepspeed, or give a --deepspeed --save directory")
        return
    try:
        tag = latest.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ArgumentError(f"--load {root}: cannot read {latest} ({exc}): give a directory a --deepspeed --save wrote")
    if not tag or "/" in tag:
        raise ArgumentError(f"--load {root}: {latest} should name a tag such as global_step2, found {tag[:40]!r}")
    where = root / tag
    found = {p.name for p in where.glob("*.pt")} if where.is_dir() else set()
    wanted = _engine_files(stage, bf16, tp, dp)
    if found != wanted:
        missing, extra = sorted(wanted - found), sorted(found - wanted)
        said = f"lacks {missing[0]}" + (f" and {len(missing) - 1} more" if len(missing) > 1 else "") if missing \
            else f"has {len(extra)} file(s) this run would not read, e.g. {extra[0]}"
        raise ArgumentError(f"--load {root}: {tag} {said} for ZeRO stage {stage}, {'bf16' if bf16 else 'fp16/fp32'}, "
                            f"tensor-parallel {tp}, data-parallel {dp}: resume with the stage, precision and sizes "
                            "it was saved with")
    from minitron.runtime.checkpoint.shard_owner import deepspeed_owner_mismatch   # torch-free
    problem = deepspeed_owner_mismatch(where, tp, dp)   # each file's owner record against its name
    if problem:
        raise ArgumentError(f"--load {root}: {problem}")


def _check_universal_load(root: Path, tp: int) -> None:
    """A universal checkpoint: ``latest_universal`` names a tag holding ``zero/`` (one folder per
    parameter) and the model-states file(s) ds_to_universal copied. The engine refuses to start
    from scratch without one, as DeepSpeed does, so its absence is refused here, in one line."""
    from minitron.runtime.checkpoint import constants as C   # torch-free; the package only when needed

    convert = ("convert a --deepspeed --save tag with python -m minitron.runtime.checkpoint.ds_to_universal "
               "--input_folder SAVE/global_stepN --output_folder OUT/global_stepN and --load OUT")
    if tp != 1:
        raise ArgumentError(f"--load {root} with checkpoint.load_universal at --tensor-model-parallel-size {tp}: "
                            "a universal checkpoint loads at tensor-parallel size 1 here; use 1")
    latest = root / C.LATEST_UNIVERSAL
    if not latest.is_file():
        raise ArgumentError(f"--load {root} has no {C.LATEST_UNIVERSAL}, and the ds_config sets checkpoint."
                            f"load_universal: {convert}")
    tag = latest.read_text(errors="replace").strip()
    if not tag or "/" in tag:
        raise ArgumentError(f"--load {root}: {latest} should name a tag such as global_step2, found {tag[:40]!r}")
    mp = f"{C.MODEL_FILE_PREFIX}00{C.MODEL_FILE_SUFFIX}"
    models = [root / tag / mp, root / tag / f"{C.ZERO_FILE_PREFIX}0_{mp}"]
    if not (root / tag / C.UNIVERSAL_ZERO_FOLDER).is_dir() or not any(f.is_file() for f in models):
        raise ArgumentError(f"--load {root}: {tag} lacks {C.UNIVERSAL_ZERO_FOLDER}/ or {mp}, so it is no "
                            f"universal checkpoint: {convert}")
