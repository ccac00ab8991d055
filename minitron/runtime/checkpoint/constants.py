"""File names and keys of DeepSpeed 0.19.8's checkpoints (``deepspeed/checkpoint/constants.py``),
the ones this layout uses. A reader such as DeepSpeed's ``zero_to_fp32`` finds its way by these
strings alone, so they are spelled exactly as DeepSpeed spells them."""

# The DeepSpeed release whose layout minitron writes; stored as ``ds_version``, which DeepSpeed's
# readers print and may branch on.
DS_VERSION_WRITTEN = "0.19.8"

# --- file names ----------------------------------------------------------------------------------
MODEL_FILE_PREFIX = "mp_rank_"
ZERO_FILE_PREFIX = "zero_pp_rank_"
BF16_ZERO_FILE_PREFIX = "bf16_" + ZERO_FILE_PREFIX    # bf16 runs' optimizer files (fp16 has none)
OPTIM_FILE_SUFFIX = "_optim_states.pt"
MODEL_FILE_SUFFIX = "_model_states.pt"
LATEST = "latest"
LATEST_UNIVERSAL = "latest_universal"   # beside the converted tag, naming it (universal checkpoints)
RECOVERY_SCRIPTS = ("zero_to_fp32.py", "zero_to_torch.py")   # copied beside the tags

# --- keys of the model-states file ---------------------------------------------------------------
PARAM_SHAPES = "param_shapes"
BUFFER_NAMES = "buffer_names"
FROZEN_PARAM_SHAPES = "frozen_param_shapes"
FROZEN_PARAM_FRAGMENTS = "frozen_param_fragments"
SHARED_PARAMS = "shared_params"
DS_CONFIG = "ds_config"
DS_VERSION = "ds_version"
CHECKPOINT_PARALLEL_DIMS = "checkpoint_parallel_dimensions"

# --- keys of the optimizer state ------------------------------------------------------------------
OPTIMIZER_STATE_DICT = "optimizer_state_dict"
BASE_OPTIMIZER_STATE = "base_optimizer_state"
BASE_OPTIMIZER_STATE_STEP = "base_optimizer_state_step"   # elastic_checkpoint: the groups' step, apart
SINGLE_PARTITION_OF_FP32_GROUPS = "single_partition_of_fp32_groups"   # stages 1-2, padding cut off
FP32_FLAT_GROUPS = "fp32_flat_groups"                                 # stage 3, padding kept
FP32_GROUPS_FLAT = "fp32_groups_flat"                                 # stage 0 at 16 bits, unpadded
FP32_GROUPS = "fp32_groups"                      # the same from FP16_UnfusedOptimizer, per parameter
ZERO_STAGE = "zero_stage"
PARTITION_COUNT = "partition_count"
GROUP_PADDINGS = "group_paddings"
PARAM_ALIGNMENT_PADDINGS = "param_alignment_paddings"
PARAM_SLICE_MAPPINGS = "param_slice_mappings"
LOSS_SCALER = "loss_scaler"
CLIP_GRAD = "clip_grad"

# --- the universal checkpoint (ds_to_universal.py, universal_checkpoint.py) -------------------------
UNIVERSAL_CHECKPOINT_INFO = "universal_checkpoint_info"   # in the model-states file; the client writes it
UNIVERSAL_CHECKPOINT_VERSION_KEY = "universal_checkpoint_version"
UNIVERSAL_CHECKPOINT_VERSION_VALUE = 0.4
UNIVERSAL_ZERO_FOLDER = "zero"                    # OUT/zero/<parameter name>/<state>.pt
UNIVERSAL_OPTIMIZER_STATE = "optimizer_state.pt"  # OUT/zero/optimizer_state.pt: what is not per parameter
FP32_WEIGHT_KEY = "fp32"
UNIVERSAL_STATES = (FP32_WEIGHT_KEY, "exp_avg", "exp_avg_sq")   # one file each per parameter, plus step.pt
PARAM = "param"            # the whole tensor, inside each state's file (stages 1-2)
CAT_DIM = "cat_dim"        # the dimension tensor-parallel slices were joined along (0 without them)
PARAM_GROUPS = "param_groups"
