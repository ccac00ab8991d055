"""DeepSpeed's checkpoint layout (``deepspeed/checkpoint/`` and the save/load half of
``deepspeed/runtime/engine.py``), as 0.19.8 writes it:

    save_dir/latest                                  the tag last saved
    save_dir/zero_to_fp32.py, zero_to_torch.py       (ZeRO 1-3) rebuild whole weights from a tag
    save_dir/tag/mp_rank_00_model_states.pt          stages 0-2: the module, counters, schedule,
                                                     and the names and shapes of the flat groups
    save_dir/tag/zero_pp_rank_{r}_mp_rank_00_model_states.pt
                                                     stage 3: the same, one per rank (its module
                                                     entries are empty: each rank has only pieces)
    save_dir/tag/[bf16_]zero_pp_rank_{r}_mp_rank_00_optim_states.pt
                                                     stages 1-3: rank r's partition of the fp32
                                                     master and of Adam's moments

constants.py names the files and keys, engine_checkpoint.py writes and reads the model-states
files, zero_checkpoint.py the optimizer's state at each stage, adam_state.py turns either
Adam's state form (FusedAdam's, torch's) into the running one's, pickles.py reads the DeepSpeed
objects inside a DeepSpeed-written file without importing DeepSpeed; zero_to_fp32.py and
zero_to_torch.py are the scripts copied beside the tags (minitron's own, torch only).

The universal checkpoint, which any data-parallel size and ZeRO stage loads:

    uni_dir/latest_universal                         the converted tag
    uni_dir/tag/*_model_states.pt                    copied from the checkpoint
    uni_dir/tag/zero/<parameter>/fp32.pt, exp_avg.pt, exp_avg_sq.pt[, step.pt]
                                                     each parameter whole, in fp32, with its moments
    uni_dir/tag/zero/optimizer_state.pt              loss scaler and param groups

ds_to_universal.py writes it from a ZeRO 1-3 checkpoint (DeepSpeed's converter and CLI);
universal_checkpoint.py cuts each rank's partitions out of it when the ds_config says
``"checkpoint": {"load_universal": true}``.
"""
