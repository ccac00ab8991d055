"""The MoE losses' per-layer record: what the iteration log prints (Megatron's moe_logging.py).

Each MoE layer records its balance loss (divided by its coefficient, so the logged number reads
the same whatever the weight) and its z-loss per micro-batch; after the step,
``track_moe_metrics`` turns the rank's shares into the model's values and returns, per name,
the mean over micro-batches and MoE layers.

How a rank's share becomes the model's value depends on what the share is:

* ``load_balancing_loss`` / ``seq_load_balancing_loss``: each rank's value is its tokens' part
  of its micro-batch's loss (moe_utils.switch_load_balancing_loss_func), so the parts are
  summed over the ranks that split a micro-batch (tensor x context parallel) and the data-
  parallel replicas, which saw different micro-batches, are averaged;
* ``global_load_balancing_loss``: the counts are the global batch's, over tensor x data x
  context parallel, so the parts are summed over that whole group;
* ``z_loss``: each rank's value is a mean over its own tokens: averaged over the same group.

Every name is also collected over the pipeline, whose stages hold different layers.
"""

from __future__ import annotations

import torch

from minitron.core import parallel_state

# name -> one value per layer of the whole model, summed over this step's micro-batches
_MOE_LAYER_WISE_LOGGING_TRACKER: dict[str, torch.Tensor] = {}
# name -> how its shares combine: "sum-tp-cp, mean-dp", "sum-tp-dp-cp" or "mean-tp-dp-cp"
REDUCTION_OF = {"load_balancing_loss": "sum-tp-cp, mean-dp", "seq_load_balancing_loss": "sum-tp-cp, mean-dp",
              "global_load_balancing_loss": "sum-tp-dp-cp", "z_loss": "mean-tp-dp-cp"}


def save_to_aux_losses_tracker(name: str, loss: torch.Tensor, layer_number: int, num_layers: int) -> None:
    """Add this micro-batch's ``loss`` of layer ``layer_number`` (1-based) to the step's record."""
    values = _MOE_LAYER_WISE_LOGGING_TRACKER.get(name)
    if values is None:
        values = _MOE_LAYER_WISE_LOGGING_TRACKER[name] = torch.zeros(num_layers, device=loss.device)
    values[layer_number - 1] += loss.detach().float()


def clear_aux_losses_tracker() -> None:
    for values in _MOE_LAYER_WISE_LOGGING_TRACKER.values():
        values.zero_()


def reduce_aux_losses_tracker_across_ranks() -> None:
    """Every rank ends with the model's per-layer values (see the module docstring)."""
    for name in sorted(_MOE_LAYER_WISE_LOGGING_TRACKER):   # the same order on every rank
        values = _MOE_LAYER_WISE_LOGGING_TRACKER[name]
        torch.distributed.all_reduce(values, group=parallel_state.get_pipeline_model_parallel_group())
        if REDUCTION_OF[name] == "sum-tp-cp, mean-dp":
            torch.distributed.all_reduce(values, group=parallel_state.get_tensor_and_context_parallel_group())
            torch.distributed.all_reduce(values, group=parallel_state.get_data_parallel_group())
            values /= parallel_state.get_data_parallel_world_size()
        else:
            group = parallel_state.get_tensor_and_data_parallel_group(with_context_parallel=True)
            torch.distributed.all_reduce(values, group=group)
            if REDUCTION_OF[name].startswith("mean"):
                values /= group.size()


def track_moe_metrics(loss_scale: float, num_moe_layers: int, num_layers: int,
                      names: tuple[str, ...]) -> dict[str, float]:
    """After a step: {name: its mean over micro-batches and MoE layers} for each of ``names``,
    the losses this model records (every rank passes the same).

    Collective over the whole world (every rank calls it, with the same model): a stage
    without MoE layers still joins the pipeline all-reduce, with zeros.
    """
    device = "cuda" if torch.distributed.get_backend() == "nccl" else "cpu"
    for name in names:   # this stage has no MoE layer (or recorded nothing): join with zeros
        _MOE_LAYER_WISE_LOGGING_TRACKER.setdefault(name, torch.zeros(num_layers, device=device))
    reduce_aux_losses_tracker_across_ranks()
    metrics = {name: (values.sum() * loss_scale / num_moe_layers).item()
               for name, values in _MOE_LAYER_WISE_LOGGING_TRACKER.items()}
    clear_aux_losses_tracker()
    return metrics


def logged_losses(config) -> tuple[str, ...]:
    """The names this model's routers record while training (what track_moe_metrics reports)."""
    balance = {"aux_loss": "load_balancing_loss", "seq_aux_loss": "seq_load_balancing_loss",
               "global_aux_loss": "global_load_balancing_loss"}.get(config.moe_router_load_balancing_type)
    names = (balance,) if balance and config.moe_aux_loss_coeff > 0 else ()
    return names + (("z_loss",) if config.moe_z_loss_coeff is not None else ())
