"""What a training run reports: the padded vocabulary, the parameters per rank, and Megatron's
per-iteration log line with its JSON record.

The loss exists only on the last pipeline stage, and after the data-parallel average every rank
there holds the same value, so one rank speaks for the iterations: the last rank of the world
(print_rank_last). Every ``--log-interval`` iterations it prints Megatron's line, whose numbers
cover the whole interval (the mean loss of the iterations that stepped, the mean time per
iteration, the skipped and nan iterations counted since the last line; the grad norm, and with
--log-num-zeros-in-grad / --log-params-norm the zero count and the params norm, are the logged
iteration's own, as Megatron prints them). ``--log-jsonl PATH`` gets
one object per iteration from the same rank, every iteration, logged or not: ``minitron
pretrain`` draws its progress bar and its closing summary from it.

``--log-throughput`` adds Megatron's ``throughput per GPU (TFLOP/s/GPU)``: not a measurement
but the model's FLOPs of the batch as Megatron counts them (theoretical_flops.py) over the time
per iteration and the world size. On a GPU whose peak the table knows, the line and the record
also give MFU, that rate over the peak; on the CPU there is no peak and no MFU. On a GPU, each
data-parallel rank 0 prints Megatron's memory line after the first logged iterations.
"""

from __future__ import annotations

import json
import math
import os
import time

import torch

from minitron.accelerator import get_accelerator
from minitron.core import parallel_state as mpu
from minitron.core.num_microbatches_calculator import get_num_microbatches
from minitron.core.optimizer_param_scheduler import get_canonical_lr_for_logging
from minitron.core.transformer.moe.moe_logging import REDUCTION_OF as MOE_LOSSES
from minitron.training.theoretical_flops import (
    model_flops_utilization, num_floating_point_operations, peak_tflops_of, throughput_per_gpu,
)
from minitron.training.tokenizer import _vocab_size_with_padding
from minitron.training.utils import is_last_rank, print_rank_0, print_rank_last, print_to_console


def print_vocab_padding(args, tokenizer) -> None:
    """Megatron's line about the padded vocabulary, and a note when tp changes the model.

    The embedding and output layer have ``padded_vocab_size`` rows, a multiple of
    ``--make-vocab-size-divisible-by`` x tp, so the same tokenizer can give a tp=2 model more rows
    than the tp=1 model: extra parameters, different initial weights, different losses.
    """
    size, padded = tokenizer.vocab_size, args.padded_vocab_size
    print_rank_0(f" > padded vocab (size: {size}) with {padded - size} dummy tokens (new size: {padded})")
    serial = _vocab_size_with_padding(size, args.make_vocab_size_divisible_by, 1)
    chosen = padded != _vocab_size_with_padding(size, args.make_vocab_size_divisible_by, args.tensor_model_parallel_size)
    if padded != serial and not chosen:   # --padded-vocab-size gives every layout the same rows
        print_rank_0(f" > note: the serial model (tp=1) pads this vocabulary to {serial}, not {padded}, so the "
                     "two models differ (layouts train alike only where the padded sizes agree)")


def print_parameter_count(model) -> None:
    """Megatron's count of this rank's parameters, printed by one rank per (tensor, pipeline)
    pair: its data-parallel and context-parallel replicas hold the same tensors."""
    if mpu.get_data_parallel_rank() == 0 and mpu.get_context_parallel_rank() == 0:
        count = sum(p.nelement() for chunk in model for p in chunk.parameters())
        print_to_console(f" > number of parameters on (tensor, pipeline) model parallel rank "
                         f"({mpu.get_tensor_model_parallel_rank()}, {mpu.get_pipeline_model_parallel_rank()}): "
                         f"{count}")


class IterationLog:
    """Megatron's training_log: the line and the record on the last rank; on a GPU, the memory
    line of each data-parallel rank 0 after the first iterations."""

    def __init__(self, args):
        self.args = args
        self.speaker = is_last_rank()
        self.file = open(args.log_jsonl, "a") if (self.speaker and args.log_jsonl) else None
        self.log_throughput = args.log_throughput
        on_gpu = get_accelerator().current_device_name().startswith("cuda")
        self.peak_tflops = device_peak_tflops() if on_gpu and self.log_throughput else None
        # Megatron reports memory at each logged iteration until one past the first has been
        # logged: the optimizer creates its state during the first step, so the second report
        # holds it. The CPU has no allocator counters to report.
        self.report_memory_until = args.iteration + 1 if on_gpu else None
        self._reset_interval()

    def _reset_interval(self) -> None:
        self.loss_sums: dict[str, float] = {}
        self.advanced = self.skipped = self.nan = 0
        self.seconds = 0.0

    def iteration(self, iteration, loss: dict, skipped: int, grad_norm, num_zeros, optimizer,
                  batch_size: int, seconds: float, params_norm=None) -> None:
        """One iteration's numbers; ``num_zeros`` and ``params_norm`` are None unless
        --log-num-zeros-in-grad / --log-params-norm asked for them."""
        logged = iteration % self.args.log_interval == 0
        if self.speaker:
            self._speak(iteration, loss, skipped, grad_norm, num_zeros, optimizer, batch_size, seconds, logged,
                        params_norm)
        if logged and self.report_memory_until is not None:
            report_memory(f"(after {iteration} iterations)")
            if iteration > self.report_memory_until:
                self.report_memory_until = None

    def _speak(self, iteration, loss, skipped, grad_norm, num_zeros, optimizer, batch_size, seconds, logged,
               params_norm):
        args = self.args
        lr = get_canonical_lr_for_logging(optimizer.param_groups)
        scale = float(optimizer.get_loss_scale())
        # A stepped iteration adds its loss to the interval's mean; a skipped one (fp16 overflow)
        # adds nothing, and counts as a nan iteration if its loss was not finite.
        got_nan = False
        for key, value in loss.items():
            if skipped:
                got_nan = got_nan or not math.isfinite(value)
            else:
                self.loss_sums[key] = self.loss_sums.get(key, 0.0) + value
        self.advanced += 0 if skipped else 1
        self.skipped += skipped
        self.nan += int(got_nan)
        self.seconds += seconds
        # The model's FLOPs of this batch (Megatron's closed-form count, not a measurement): every
        # record has them, so `pretrain`'s summary can state TFLOP/s/GPU with or without the flag.
        flops = num_floating_point_operations(args, batch_size)
        record = {
            "iteration": iteration, "lm_loss": loss.get("lm loss"), "grad_norm": _num(grad_norm),
            "lr": lr, "loss_scale": scale, "skipped": skipped, "nan": int(got_nan), "num_zeros": _num(num_zeros),
            "num_microbatches": get_num_microbatches(), "global_batch_size": batch_size,
            "consumed_samples": args.consumed_train_samples, "elapsed_ms": seconds * 1000.0,
            "tokens_per_s": batch_size * args.seq_length / seconds if seconds > 0 else 0.0,
            "flops": flops,
        }
        if params_norm is not None:
            record["params_norm"] = params_norm
        if self.log_throughput and seconds > 0:
            record.update(self._throughput(flops, seconds))
        for name in MOE_LOSSES:   # MoE (moe/moe_logging.track_moe_metrics)
            if name in loss:
                record[name] = loss[name]
        for name, value in loss.items():   # multi-token prediction's "mtp_k loss" (track_mtp_metrics)
            if name.startswith("mtp_"):
                record[name.replace(" ", "_")] = value
        if self.file:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
        if logged:
            print_rank_last(self._line(iteration, lr, batch_size, scale, grad_norm, num_zeros, flops, params_norm))
            self._reset_interval()

    def _throughput(self, flops: float, seconds: float) -> dict:
        """TFLOP/s per GPU over ``seconds``, and MFU where the device's peak is known."""
        tflops = throughput_per_gpu(flops, seconds, self.args.world_size)
        out = {"throughput_tflops_per_gpu": tflops}
        if self.peak_tflops is not None:
            out["mfu"] = model_flops_utilization(tflops, self.peak_tflops)
        return out

    def _line(self, iteration, lr, batch_size, scale, grad_norm, num_zeros, flops, params_norm) -> str:
        """Megatron's fields, in Megatron's order, each closed by ' |'."""
        args = self.args
        per_iteration_s = self.seconds / max(self.advanced + self.skipped, 1)
        s = f" [{log_time()}]"
        s += f" iteration {iteration:8d}/{args.train_iters:8d} |"
        s += f" consumed samples: {args.consumed_train_samples:12d} |"
        s += f" elapsed time per iteration (ms): {per_iteration_s * 1000.0:.1f} |"
        if self.log_throughput and per_iteration_s > 0:
            # Megatron's: this batch's FLOPs over the interval's mean time per iteration.
            rates = self._throughput(flops, per_iteration_s)
            s += f" throughput per GPU (TFLOP/s/GPU): {rates['throughput_tflops_per_gpu']:.1f} |"
            if "mfu" in rates:   # ours: Megatron leaves the division by the peak to the reader
                s += f" MFU (%): {100 * rates['mfu']:.1f} |"
        s += f" learning rate: {lr:.6E} |"
        s += f" global batch size: {batch_size:5d} |"
        for key, total in self.loss_sums.items():
            s += f" {key}: {total / max(self.advanced, 1):.6E} |"
        s += f" loss scale: {scale:.1f} |"
        if grad_norm is not None:
            s += f" grad norm: {_num(grad_norm):.3f} |"
        if num_zeros is not None:
            s += f" num zeros: {int(_num(num_zeros))} |"
        if params_norm is not None:
            s += f" params norm: {params_norm:.3f} |"
        s += f" number of skipped iterations: {self.skipped:3d} |"
        s += f" number of nan iterations: {self.nan:3d} |"
        return s

    def close(self) -> None:
        if self.file:
            self.file.close()


def device_peak_tflops() -> float | None:
    """This rank's GPU's dense bf16 peak from theoretical_flops' table, or None (unknown card)."""
    return peak_tflops_of(torch.cuda.get_device_name(get_accelerator().current_device_name()))


def report_memory(name: str) -> None:
    """Megatron's memory line (megatron/training/utils.py keeps it): the CUDA allocator's
    counters of this rank's GPU, in MB, from each data-parallel rank 0 (its replicas hold the
    same tensors). Reserved is what the allocator holds from the driver, allocated what tensors
    use of it; the max are the peaks since the start."""
    if mpu.get_data_parallel_rank() != 0:
        return
    mb = 1024.0 * 1024.0
    counters = (("allocated", torch.cuda.memory_allocated), ("max allocated", torch.cuda.max_memory_allocated),
                ("reserved", torch.cuda.memory_reserved), ("max reserved", torch.cuda.max_memory_reserved))
    text = f"{name} memory (MB)" + "".join(f" | {label}: {read() / mb:.2f}" for label, read in counters)
    print_to_console(f"[Rank {torch.distributed.get_rank()}] {text}")


def log_time() -> str:
    """The time a log line carries, as Megatron prints it. SOURCE_DATE_EPOCH, the reproducible-
    builds convention, stands in for the clock when set: the site's build sets it to the time
    of the code it runs (docs/hooks/run_commands.py), so the same code prints the same pages."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    when = time.gmtime(int(epoch)) if epoch.isdigit() else time.localtime()
    return time.strftime("%Y-%m-%d %H:%M:%S", when)


def _num(value):
    if value is None:
        return None
    return float(value.item() if hasattr(value, "item") else value)
