"""fp16 vs bf16 in numbers, and the dynamic loss scale through a scripted run of overflows.

    python scripts/show_loss_scale.py --formats            # the two 16-bit formats, and underflow
    python scripts/show_loss_scale.py                      # the scale, step by step
    python scripts/show_loss_scale.py --flags ..x..xx.... --window 3 --hysteresis 2
    python scripts/show_loss_scale.py --natural 18         # Megatron's defaults, no injection

The last three train a tiny fp16 model on one gloo rank with minitron's DDP and
Float16OptimizerWithFloat16Params. At every step marked 'x' an Inf is written into one
gradient before the optimizer step, as an fp16 overflow would. --natural injects nothing and
starts from Megatron's initial scale, 2**32: the overflows are the model's own.
"""

from __future__ import annotations

import argparse
import math
import os
import sys


def formats() -> None:
    import torch

    print(f"{'':10}{'exponent':>9}{'mantissa':>9}{'largest':>12}{'smallest normal':>17}{'spacing at 1':>14}")
    for dtype, e, m in ((torch.float32, 8, 23), (torch.float16, 5, 10), (torch.bfloat16, 8, 7)):
        fi = torch.finfo(dtype)
        print(f"{str(dtype).replace('torch.', ''):10}{e:>9}{m:>9}{fi.max:>12.3g}{fi.tiny:>17.3g}{fi.eps:>14.3g}")
    print()
    def show(label: str, t) -> None:
        print(f"{label:30}" + "  ".join(f"{v:>9.3g}" for v in t.float().tolist()))

    grad = torch.tensor([1e-8, 1e-6, 2e-5])
    show("gradients, fp32:", grad)
    show("stored in fp16:", grad.half())
    show("x 2**16, then stored in fp16:", (grad * 2 ** 16).half())
    show("... back in fp32, / 2**16:", (grad * 2 ** 16).half().float() / 2 ** 16)
    show("stored in bf16:", grad.bfloat16())
    one_plus = [(torch.tensor(1.0, dtype=d) + 1e-3).item() for d in (torch.float16, torch.bfloat16)]
    print(f"{'1 + 0.001 in fp16, in bf16:':30}{one_plus[0]:>9.6g}  {one_plus[1]:>9.6g}")


def _power(x: float) -> str:
    """2^16 rather than 65536: loss scales move by factors of two."""
    exponent = math.log2(x)
    return f"2^{int(exponent)}" if exponent.is_integer() else f"{x:g}"


def scale_trace(flags: str, initial: float, window: int, hysteresis: int, min_scale: float) -> None:
    from types import SimpleNamespace

    import torch
    import torch._dynamo  # noqa: F401  (torch.optim loads it on first use; import it up front)

    from minitron.core import parallel_state
    from minitron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from minitron.core.distributed.finalize_model_grads import finalize_model_grads
    from minitron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel(1)
        torch.manual_seed(0)
        model = DistributedDataParallel(SimpleNamespace(sequence_parallel=False),
                                        DistributedDataParallelConfig(), torch.nn.Linear(4, 2).half())
        config = OptimizerConfig(lr=1e-3, fp16=True, initial_loss_scale=initial, loss_scale_window=window,
                                 hysteresis=hysteresis, min_loss_scale=min_scale)
        optimizer = get_megatron_optimizer(config, [model])
        scaler = optimizer.grad_scaler
        x = torch.randn(8, 4).half()
        print(f"initial_loss_scale={_power(initial)} loss_scale_window={window} hysteresis={hysteresis} "
              f"min_loss_scale={_power(min_scale)}\n")
        print(f"{'iter':>4}  {'injected':8} {'update':8} {'scale after':>11}  "
              f"{'clean steps':>11}  {'overflows left':>14}")
        for it, flag in enumerate(flags, start=1):
            model.zero_grad_buffer()
            optimizer.zero_grad()
            before = model.module.weight.detach().clone()
            optimizer.scale_loss(model(x).float().pow(2).mean()).backward()
            finalize_model_grads([model])
            if flag == "x":
                model.module.weight.main_grad[0, 0] = float("inf")
            ok, _, _ = optimizer.step()
            changed = not torch.equal(before, model.module.weight)
            assert ok == changed, "a skipped step must leave the weights alone"
            print(f"{it:>4}  {'Inf' if flag == 'x' else '-':8} {'applied' if ok else 'SKIPPED':8} "
                  f"{_power(scaler.scale.item()):>11}  {scaler._growth_tracker:>11}  {scaler._hysteresis_tracker:>14}")
    finally:
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", action="store_true", help="print the 16-bit formats instead")
    parser.add_argument("--flags", default="...x.xx.....xxxxx..", help="'.' a clean step, 'x' an overflow")
    parser.add_argument("--initial", type=float, default=2.0 ** 16)
    parser.add_argument("--window", type=int, default=3, help="loss_scale_window (Megatron: 1000)")
    parser.add_argument("--hysteresis", type=int, default=2)
    parser.add_argument("--min-scale", type=float, default=2.0 ** 13)
    parser.add_argument("--natural", type=int, metavar="STEPS",
                        help="no injected Infs; Megatron's defaults (2**32, window 1000, hysteresis 2, min 1)")
    args = parser.parse_args(argv)
    if args.natural is not None:
        args.flags, args.initial, args.window, args.hysteresis, args.min_scale = (
            "." * args.natural, 2.0 ** 32, 1000, 2, 1.0)
    if set(args.flags) - set(".x") or args.window < 1 or args.hysteresis < 1 or not 0 < args.min_scale <= args.initial:
        parser.error("--flags uses only '.' and 'x'; --window, --hysteresis >= 1; 0 < --min-scale <= --initial")
    if args.formats:
        formats()
    else:
        scale_trace(args.flags, args.initial, args.window, args.hysteresis, args.min_scale)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
