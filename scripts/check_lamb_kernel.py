"""minitron's FusedLamb (ops/lamb/) against DeepSpeed's own FusedLamb CUDA kernel, on a GPU.

    python scripts/check_lamb_kernel.py --csrc PATH/TO/deepspeed/ops/csrc

DeepSpeed builds its Lamb for CUDA only, so no CPU test can run it. This script JIT-builds the
kernel from an installed DeepSpeed's sources (csrc/lamb and csrc/includes, with the flags its
FusedLambBuilder uses), calls it as DeepSpeed's FusedLamb.step does, tensor by tensor, and steps
minitron's FusedLamb on copies of the same tensors: five steps of several tensor sizes (one of
them spread over many thread blocks) and option sets, the trust ratios clipped at both bounds.
It prints the largest relative differences of the weights, the moments and the ratios, and
exits 1 past the tolerance (the kernel builds with --use_fast_math, and sums its norms in
another order, so fp32 rounding differs in the last bits).
"""

from __future__ import annotations

import argparse
import sys

import torch

OPTIONS = [{}, {"weight_decay": 0.01, "max_coeff": 0.5, "min_coeff": 0.05},
           {"eps_inside_sqrt": True, "bias_correction": False, "eps": 1e-3}, {"min_coeff": 3.0, "max_coeff": 2.0}]
SHAPES = [(1000, 700), (37,), (256, 3)]
TOLERANCE = 1e-4


def build(csrc: str):
    from torch.utils.cpp_extension import load
    return load(name="ds_fused_lamb_check", sources=[f"{csrc}/lamb/fused_lamb_cuda.cpp",
                                                      f"{csrc}/lamb/fused_lamb_cuda_kernel.cu"],
                extra_include_paths=[f"{csrc}/includes"], extra_cflags=["-O3"],
                extra_cuda_cflags=["-O3", "-lineinfo", "--use_fast_math"], verbose=False)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def check(kernel, options: dict, device: str = "cuda") -> dict:
    from minitron.ops.lamb import FusedLamb
    torch.manual_seed(0)
    group = dict(lr=1e-2, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, max_coeff=10.0,
                 min_coeff=0.01) | {k: v for k, v in options.items() if k != "eps_inside_sqrt"}
    mine = [torch.nn.Parameter(torch.randn(s, device=device)) for s in SHAPES]
    theirs = [{"p": p.detach().clone(), "m": torch.zeros_like(p), "v": torch.zeros_like(p)} for p in mine]
    opt = FusedLamb(mine, eps_inside_sqrt=options.get("eps_inside_sqrt", False), **group)
    worst = {"weights": 0.0, "exp_avg": 0.0, "exp_avg_sq": 0.0, "trust ratio": 0.0}
    for step in range(1, 6):
        grads = [torch.randn(s, device=device) * 10 ** k for k, s in enumerate(SHAPES)]
        coeffs = []
        for t, g in zip(theirs, grads):   # as DeepSpeed's FusedLamb.step calls it, tensor by tensor
            coeff = kernel.lamb(t["p"], torch.tensor([], dtype=torch.float), t["m"], t["v"], g, group["lr"],
                                group["betas"][0], group["betas"][1], group["max_coeff"], group["min_coeff"],
                                group["eps"], 1.0, step, 0 if options.get("eps_inside_sqrt") else 1,
                                1 if group["bias_correction"] else 0, group["weight_decay"])
            coeffs.append(coeff.item())
        for p, g in zip(mine, grads):
            p.grad = g
        opt.step()
        for p, t in zip(mine, theirs):
            state = opt.state[p]
            for name, a, b in (("weights", p.detach(), t["p"]), ("exp_avg", state["exp_avg"], t["m"]),
                               ("exp_avg_sq", state["exp_avg_sq"], t["v"])):
                worst[name] = max(worst[name], relative(a, b))
        worst["trust ratio"] = max(worst["trust ratio"], relative(torch.tensor(opt.get_lamb_coeffs()),
                                                                  torch.tensor(coeffs)))
    return worst


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csrc", required=True, help="an installed DeepSpeed's ops/csrc folder")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU: DeepSpeed's FusedLamb is a CUDA kernel", file=sys.stderr)
        return 2
    kernel = build(args.csrc)
    failed = False
    for options in OPTIONS:
        worst = check(kernel, options)
        failed |= max(worst.values()) > TOLERANCE
        print(f"{str(options) or '{}':<70} " + "  ".join(f"{k} {v:.1e}" for k, v in worst.items()))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: "
          + ("FAILED" if failed else f"all within {TOLERANCE:g} (relative)"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
