"""TransformerConfig: every size and switch the model's layers read, under Megatron's field names.

Megatron splits it in two: ModelParallelConfig (how the model is cut and stored) and
TransformerConfig (what the model is), the second inheriting the first. We keep that shape,
in one file, with only the fields minitron's GPT uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from minitron.core.pipeline_parallel.layer_layout import config_split_problem, counts_from


def init_method_normal(sigma: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """Weights ~ N(0, sigma^2), drawn from torch's default generator."""
    def init_(tensor: torch.Tensor) -> torch.Tensor:
        return torch.nn.init.normal_(tensor, mean=0.0, std=sigma)
    return init_


def scaled_init_method_normal(sigma: float, num_layers: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """N(0, (sigma / sqrt(2 * num_layers))^2), for the two projections that feed a residual.

    Each layer adds two outputs (attention, MLP) to the residual stream, 2L additions in all;
    shrinking those projections by sqrt(2L) keeps the stream's variance from growing with
    depth (the GPT-2 recipe).
    """
    return init_method_normal(sigma / math.sqrt(2.0 * num_layers))


@dataclass
class ModelParallelConfig:
    """How the model is split and stored."""

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: int | None = None
    # The interleaved schedule's group: micro-batches in a row per model chunk (None: pp).
    microbatch_group_size_per_vp_stage: int | None = None
    # An uneven split of the layers over the pipeline (pipeline_parallel_layer_layout.py).
    num_layers_in_first_pipeline_stage: int | None = None
    num_layers_in_last_pipeline_stage: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    pipeline_model_parallel_layout: str | None = None
    # Split the sequence dimension across the TP group in the regions TP leaves replicated
    # (layernorm, dropout, residual): saves activation memory, same numbers.
    sequence_parallel: bool = False
    params_dtype: torch.dtype = torch.float32
    # False: allocate parameters but skip drawing their values (a checkpoint will overwrite them).
    perform_initialization: bool = True
    # --use-cpu-initialization: draw every weight whole on the CPU and keep this rank's slice, so
    # the numbers do not depend on tp. Without it a GPU rank draws its slices on the device
    # (Megatron's default). A CPU rank always draws as with it (tensor_parallel/weight_init.py).
    use_cpu_initialization: bool = False
    # Seed of the layout-independent initialization (core/init_rng.py); None: torch's stream.
    init_seed: int | None = None
    # Hooks the training setup (setup_model_and_optimizer) installs and the pipeline schedules
    # call, carried by the config so the schedules need no other handle on the optimizer or the
    # DDP wrapper (as in Megatron):
    grad_scale_func: Callable | None = None          # optimizer.scale_loss (fp16 loss scaling)
    no_sync_func: Callable | None = None             # DDP's no_sync: hold back gradient reduction
    finalize_model_grads_func: Callable | None = None  # reduce gradients once all micro-batches are done
    pipeline_dtype: torch.dtype | None = None        # dtype of activations sent between stages
    deallocate_pipeline_outputs: bool = True         # free sent activations, keep their graph
    # How context-parallel attention communicates: "p2p" (the ring) or "a2a" (Ulysses); one
    # for all layers, or a list with one per layer. None: p2p.
    cp_comm_type: str | list[str] | None = None
    # --cross-entropy-loss-fusion: the loss from compiled pieces (core/fusions/fused_cross_entropy.py).
    # Megatron keeps it here, in ModelParallelConfig, off by default.
    cross_entropy_loss_fusion: bool = False


# --8<-- [start:config]
@dataclass
class TransformerConfig(ModelParallelConfig):
    """What the transformer is. Zero means "not given" for the three required sizes."""

    num_layers: int = 0
    hidden_size: int = 0
    num_attention_heads: int = 0
    ffn_hidden_size: int | None = None      # None: 4 * hidden_size
    kv_channels: int | None = None          # per-head size; None: hidden_size // heads
    hidden_dropout: float = 0.1             # after attention / MLP, before the residual add
    attention_dropout: float = 0.1          # on the attention probabilities
    layernorm_epsilon: float = 1e-5         # --norm-epsilon
    layernorm_zero_centered_gamma: bool = False  # --apply-layernorm-1p: scale by (1 + weight)
    add_bias_linear: bool = True            # --disable-bias-linear turns it off
    add_qkv_bias: bool = False              # --add-qkv-bias: linear_qkv's bias alone (Qwen 2.5)
    softmax_type: str = "vanilla"           # --softmax-type: "off-by-one" / "learnable" attention sinks
    apply_query_key_layer_scaling: bool = False  # q k^T through 1/layer-number in the dtype (qk_layer_scaling.py)
    # --window-size (left, right) and --window-attn-skip-freq: sliding-window attention
    window_size: tuple | None = None
    window_attn_skip_freq: int | list | None = None
    qk_layernorm: bool = False              # --qk-layernorm: a norm over each head's query and key
    qk_l2_norm: bool = False                # --qk-l2-norm: the same place, unit RMS and no weight (Llama 4)
    no_rope_freq: int | list | None = None  # --no-rope-freq: layers without rope (N: every N-th; 0/1 list)
    activation_func: Callable = F.gelu
    init_method_std: float = 0.02
    init_method: Callable | None = None              # None: N(0, init_method_std^2)
    output_layer_init_method: Callable | None = None  # None: scaled by 1/sqrt(2 * num_layers)
    # -- the modern GPT options and activation recomputation --
    normalization: str = "LayerNorm"        # or "RMSNorm" (--normalization)
    gated_linear_unit: bool = False         # --swiglu: fc1 makes gate and up, act(gate) * up
    glu_linear_offset: float = 0.0          # act(gate) * (up + offset) (gpt-oss: 1.0)
    activation_func_clamp_value: float | None = None  # gate clamped above, up to [-v, v] (gpt-oss: 7.0)
    num_query_groups: int | None = None     # grouped-query attention; None: one per head
    rotary_interleaved: bool = False        # rope pairs channels (2i, 2i+1), not (i, i + d/2)
    recompute_granularity: str | None = None  # None, "full" (whole layers) or "selective"
    recompute_method: str | None = None       # "uniform" or "block" (full granularity)
    recompute_num_layers: int | None = None   # layers per chunk (uniform) / per stage (block)
    recompute_modules: list[str] | None = None  # selective: what to recompute (default ["core_attn"], Megatron's)
    distribute_saved_activations: bool = False  # Megatron's; not available in minitron
# --8<-- [end:config]

    # --calculate-per-token-loss: the loss of a global batch is its summed token losses over its
    # token count (the schedules and finalize_model_grads divide), not a mean of micro-batch means.
    calculate_per_token_loss: bool = False

    # Megatron's fusions (core/fusions/), compiled by jit_fuser. Off by default, as in Megatron's
    # TransformerConfig (its command line turns the first two on; minitron's does not).
    bias_activation_fusion: bool = False    # fc1's bias + GeLU (or SwiGLU) in one kernel
    bias_dropout_fusion: bool = False       # bias + dropout + residual add in one kernel

    # Mixture of experts (moe/): None experts is a dense model. Megatron's field names.
    num_moe_experts: int | None = None
    moe_router_topk: int = 2                 # experts each token is sent to
    moe_aux_loss_coeff: float = 0.0          # weight of the load-balancing loss (0: not computed)
    moe_layer_freq: int | list = 1           # every N-th layer (0-based i % N == 0), or a 0/1 list per layer
    moe_ffn_hidden_size: int | None = None   # an expert's ffn size; None: ffn_hidden_size
    moe_expert_capacity_factor: float | None = None   # None: dropless; else tokens per expert capped
    moe_pad_expert_input_to_capacity: bool = False    # every expert's input filled up to its capacity
    moe_token_drop_policy: str = "probs"     # beyond capacity, drop the least probable ("probs") or the last ("position")
    moe_router_load_balancing_type: str = "aux_loss"   # or seq_aux_loss, global_aux_loss, none
    moe_router_score_function: str = "softmax"         # or sigmoid
    moe_router_pre_softmax: bool = False     # score all E experts before the top-k, not the k after
    moe_router_topk_scaling_factor: float | None = None   # the chosen weights times this
    moe_router_dtype: str | None = None      # "fp32" / "fp64": the router's matmul and scores in it
    moe_z_loss_coeff: float | None = None    # weight of the router's z-loss (None: none)
    moe_router_enable_expert_bias: bool = False   # aux-loss-free balancing: a bias on the choice only
    moe_router_bias_update_rate: float = 1e-3     # the bias's step after each global batch
    moe_shared_expert_intermediate_size: int | None = None   # one always-on MLP of this width beside the experts
    moe_token_dispatcher_type: str = "allgather"  # or "alltoall" (moe/token_dispatcher.py)
    moe_grouped_gemm: bool = False           # the local experts as one batched matmul (experts_grouped.py)
    moe_router_num_groups: int | None = None  # group-limited routing: the experts cut into this many groups
    moe_router_group_topk: int | None = None  # ... of which each token may use this many (None: off)
    moe_router_force_load_balancing: bool = False   # random logits: balanced load, for benchmarks
    moe_apply_probs_on_input: bool = False   # the routing weight scales the expert's input (top-1), not its output
    moe_latent_size: int | None = None       # latent MoE: routed experts work in this width (moe/latent_projection.py)
    mtp_num_layers: int | None = None        # multi-token prediction: D extra layers on the last stage
    mtp_loss_scaling_factor: float = 0.1     # their losses' weight, split evenly over the D depths
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int | None = None  # None: tensor_model_parallel_size

    # Multi-latent attention (multi_latent_attention.py), the fields of Megatron's
    # MLATransformerConfig; the defaults are its arguments.py's (--kv-lora-rank 32, ...).
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None          # None: queries straight from the hidden states
    kv_lora_rank: int = 32                  # the latent that keys and values are rebuilt from
    qk_head_dim: int = 128                  # a head's query/key channels without position
    qk_pos_emb_head_dim: int = 64           # its rope channels (one key part shared by all heads)
    v_head_dim: int = 128
    rope_type: str = "yarn"                 # MLA's rope, "rope" or "yarn" (Megatron's MLA default)
    rotary_base: float = 10000              # MLA builds its own rope from these
    rotary_percent: float = 1.0
    # YaRN for MLA (yarn_rotary_pos_embedding.py), MLATransformerConfig's names and defaults
    rotary_scaling_factor: float = 40       # s: the context stretched s times
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32                   # channels turning more than this often are kept
    beta_slow: float = 1                    # ... fewer than this, slowed by s
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    # YaRN for a GPT's attention (--position-embedding-type yarn): the attributes Megatron's
    # training sets on its config (_apply_yarn_config_from_args), YarnRotaryEmbedding's defaults
    yarn_rotary_scaling_factor: float = 1.0
    yarn_original_max_position_embeddings: int = 4096
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_mscale: float = 1.0
    yarn_mscale_all_dim: float = 0.0
    yarn_correction_range_round_to_int: bool = True
    # Mamba-2 layers of a hybrid model (core/ssm/), Megatron's names and defaults
    is_hybrid_model: bool = False           # the stack follows a hybrid layer pattern (pretrain_hybrid)
    mamba_state_dim: int = 128              # n: the state each head keeps per channel
    mamba_head_dim: int = 64                # p: channels per Mamba head
    mamba_num_groups: int = 8               # heads sharing one B and C (like query groups)
    mamba_num_heads: int | None = None      # None: 2 * hidden_size // mamba_head_dim
    # fp8 GEMM inputs in the transformer layers (core/fp8_utils.py), Megatron's names and defaults
    fp8: str | None = None                  # --fp8-format: "e4m3" or "hybrid" (e5m2 gradients)
    fp8_recipe: str = "delayed"             # or "tensorwise" (current scaling)
    fp8_margin: int = 0                     # delayed: scale = fp8_max / amax / 2^margin
    fp8_amax_history_len: int = 1           # delayed: steps of amax the scale is chosen from
    fp8_amax_compute_algo: str = "most_recent"   # or "max" over the history

    def __post_init__(self):
        for name in ("num_layers", "hidden_size", "num_attention_heads", "tensor_model_parallel_size",
                     "pipeline_model_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"TransformerConfig.{name} must be a positive integer, got {getattr(self, name)}")
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = 4 * self.hidden_size
        if self.kv_channels is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                                 f"{self.num_attention_heads}; change one, or set kv_channels")
            self.kv_channels = self.hidden_size // self.num_attention_heads
        tp = self.tensor_model_parallel_size
        if self.num_attention_heads % tp:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} is not divisible by "
                             f"tensor_model_parallel_size {tp}: each TP rank must own whole heads")
        if self.ffn_hidden_size % tp:
            raise ValueError(f"ffn_hidden_size {self.ffn_hidden_size} is not divisible by "
                             f"tensor_model_parallel_size {tp}")
        if not self.is_hybrid_model:   # (a hybrid pattern's '|' may cut unevenly: core/ssm/ checks those)
            problem = config_split_problem(self)
            if problem:
                raise ValueError(problem)
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.sequence_parallel and tp == 1:
            # As Megatron's validate_args does: with one TP rank there is nothing to split.
            self.sequence_parallel = False
        if self.init_method is None:
            self.init_method = init_method_normal(self.init_method_std)
        if self.output_layer_init_method is None:
            self.output_layer_init_method = scaled_init_method_normal(self.init_method_std, self.num_layers)
        self._check_modern_options()
        if self.bias_activation_fusion and (self.activation_func, self.gated_linear_unit) not in (
                (F.gelu, False), (F.silu, True)):
            raise ValueError("bias_activation_fusion fuses GeLU or SwiGLU (silu with gated_linear_unit): "
                             "turn it off for another activation")
        if self.multi_latent_attention:
            self._check_mla()

    def _check_mla(self) -> None:
        """What Megatron's MLA asserts."""
        if self.num_query_groups != self.num_attention_heads:
            raise ValueError("multi_latent_attention excludes grouped-query attention: its heads already "
                             "share one latent; leave num_query_groups unset")
        if self.rope_type not in ("rope", "yarn"):
            raise ValueError(f"multi_latent_attention with rope_type {self.rope_type!r}: MLA's rope is "
                             "'rope' or 'yarn' (Megatron's default)")
        for name in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")

    def _check_modern_options(self) -> None:
        """The rules of Megatron's TransformerConfig for normalization, GQA and recomputation."""
        if self.normalization not in ("LayerNorm", "RMSNorm"):
            raise ValueError(f"normalization must be 'LayerNorm' or 'RMSNorm', got {self.normalization!r}")
        if self.num_query_groups is None:
            self.num_query_groups = self.num_attention_heads
        tp = self.tensor_model_parallel_size
        if self.num_attention_heads % self.num_query_groups:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} is not divisible by "
                             f"num_query_groups {self.num_query_groups}: each group shares one key and value")
        if self.num_query_groups % tp and tp % self.num_query_groups:
            raise ValueError(f"num_query_groups {self.num_query_groups} must be a multiple or a divisor of "
                             f"tensor_model_parallel_size {tp}: ranks own whole groups, or share one")
        if self.distribute_saved_activations:
            raise ValueError("distribute_saved_activations (Megatron's split of checkpointed inputs "
                             "across TP ranks) is not available in minitron")
        granularity, method, n = self.recompute_granularity, self.recompute_method, self.recompute_num_layers
        if granularity is None:
            return
        if granularity not in ("full", "selective"):
            raise ValueError(f"recompute_granularity must be 'full' or 'selective', got {granularity!r}")
        if granularity == "selective":
            if self.recompute_modules is None:
                self.recompute_modules = ["core_attn"]
            if method is not None or n is not None:
                raise ValueError("selective recomputation recomputes recompute_modules in every layer: "
                                 "recompute_method and recompute_num_layers must be None")
            return
        if method not in ("uniform", "block"):
            raise ValueError(f"full recomputation needs recompute_method 'uniform' or 'block', got {method!r}")
        # Each model chunk recomputes min(n, its layers) (Megatron's recompute.py), so n is bounded
        # by the fullest pipeline rank of the split actually built, uneven or not.
        pp = self.pipeline_model_parallel_size
        if self.is_hybrid_model:   # (the hybrid pattern's split is core/ssm/'s; the config does not hold it)
            most = self.num_layers
        else:
            counts = counts_from(self)
            most = max(sum(counts[r::pp]) for r in range(pp))
        if n is None or not 1 <= n <= most:
            raise ValueError(f"full recomputation needs recompute_num_layers between 1 and the "
                             f"{most} layers of the fullest pipeline stage, got {n}")
