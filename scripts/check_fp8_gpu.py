"""fp8 on a GPU: torch._scaled_mm against the CPU path's dequantized fp32 product.

    python scripts/check_fp8_gpu.py [--size 4096] [--json FILE]
    python scripts/check_fp8_gpu.py --show FILE     # print what a --json run recorded

minitron/core/fp8/linear.py sends an fp8 GEMM with per-tensor scales to torch._scaled_mm where the
device has fp8 tensor cores (compute capability 8.9+), and everywhere else dequantizes both
operands and multiplies in fp32. Both sum the same products of the same fp8 values, in different orders
and adders (see TOLERANCE), so they must agree far below fp8's own steps. This
script quantizes random operands as the tensorwise recipe does, for the three pairings the
layer uses (forward e4m3 x e4m3, backward e5m2 x e4m3 under --fp8-format hybrid, and e4m3
gradients), and prints for each: whether _scaled_mm took it, the largest difference between the
two paths relative to the largest product, and each path's time for one GEMM (median of 20, after
5 warm-up calls); and whether the compiled cast that CUDA tensors take (recipes.py) gives the
plain ops' bytes. Exit code 1 if a difference exceeds TOLERANCE, _scaled_mm was not taken or
the casts differ.
Without a CUDA GPU it says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # an uninstalled checkout (the GPU machine)

# Both paths sum the same k products, in different orders and not with the same adder: the
# tensor core's fp8 GEMM keeps fewer than fp32's 24 bits in its running sums between promotions
# to fp32 (about 14 on Hopper, by DeepSeek-V3's report), so agreement is to ~2^-14 of a partial
# sum, not to fp32 rounding. 1e-3 of the largest output is above that and far below anything a
# wrong scale, a lost 1/scale or a transposed operand would give (errors of order 1).
TOLERANCE = 1e-3
PAIRS = {"forward (e4m3 x e4m3)": ("e4m3", "e4m3"), "dgrad, hybrid (e5m2 x e4m3)": ("e5m2", "e4m3"),
         "dgrad, e4m3 (e4m3 x e4m3)": ("e4m3", "e4m3")}


def timed(fn, repeats: int = 20) -> float:
    import torch
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def report(device: str, torch_version: str, n: int, rows: list[dict], same_cast: bool) -> bool:
    """Print the table; True if every pair passed."""
    print(f"{device}, torch {torch_version}, GEMM {n} x {n} x {n}")
    print(f"{'pair':<30} {'_scaled_mm':>10} {'max rel diff':>13} {'fp8 ms':>8} {'deq fp32 ms':>12} {'bf16 ms':>8}")
    for r in rows:
        print(f"{r['pair']:<30} {str(r['scaled_mm']):>10} {r['max_relative_difference']:>13.2e} "
              f"{r['scaled_mm_ms']:>8.3f} {r['dequantized_fp32_ms']:>12.3f} {r['bf16_ms']:>8.3f}")
    print(f"compiled cast equals the plain ops bit for bit (e4m3, e5m2): {same_cast}")
    passed = all(r["scaled_mm"] and r["max_relative_difference"] <= TOLERANCE for r in rows)
    print(f"tolerance {TOLERANCE:g}: {'passed' if passed else 'FAILED'}")
    return passed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=int, default=4096, help="m = n = k of the GEMM (a multiple of 16)")
    p.add_argument("--json", type=Path)
    p.add_argument("--show", type=Path, metavar="FILE", help="print the figures an earlier --json run recorded")
    o = p.parse_args(argv)
    if o.show:
        try:
            rec = json.loads(o.show.read_text())
            report(rec["device"], rec["torch"], rec["size"], rec["rows"], rec["compiled_cast_bit_equal"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            print(f"check_fp8_gpu: {o.show} is not a file that --json wrote ({err})", file=sys.stderr)
            return 2
        return 0
    import torch
    if not torch.cuda.is_available():
        print("check_fp8_gpu: no CUDA GPU here; this check is for a GPU machine", file=sys.stderr)
        return 2
    from minitron.core.fp8.linear import _scaled_mm_takes, fp8_gemm
    from minitron.core.fp8.recipes import FORMATS, CurrentScaling, _cast, _cast_fused, dequantize

    torch.manual_seed(0)
    n = o.size
    rows = []
    for name, (fmt_a, fmt_b) in PAIRS.items():
        a_fp32 = torch.randn(n, n, device="cuda") * (1e-3 if fmt_a == "e5m2" else 1.0)   # gradients are small
        b_fp32 = torch.randn(n, n, device="cuda")
        a, a_inv = CurrentScaling(fmt_a).quantize(a_fp32)
        b, b_inv = CurrentScaling(fmt_b).quantize(b_fp32)
        took = _scaled_mm_takes(a, b)
        fast = fp8_gemm(a, a_inv, b, b_inv, torch.float32)
        slow = torch.nn.functional.linear(dequantize(a, a_inv), dequantize(b, b_inv))
        diff = ((fast - slow).abs().max() / slow.abs().max()).item()
        row = {"pair": name, "scaled_mm": took, "max_relative_difference": diff,
               "scaled_mm_ms": timed(lambda: fp8_gemm(a, a_inv, b, b_inv, torch.bfloat16)) * 1e3,
               "dequantized_fp32_ms": timed(lambda: torch.nn.functional.linear(dequantize(a, a_inv),
                                                                               dequantize(b, b_inv))) * 1e3,
               "bf16_ms": timed(lambda: torch.nn.functional.linear(a_fp32.bfloat16(), b_fp32.bfloat16())) * 1e3}
        rows.append(row)
    # The compiled cast (one kernel, used on CUDA) against the plain ops: the same bytes.
    x, scale = torch.randn(4096, 1000, device="cuda", dtype=torch.bfloat16) * 300, torch.tensor(0.37, device="cuda")
    same_cast = all(torch.equal(_cast_fused(x, scale, FORMATS[f][1], FORMATS[f][0]).view(torch.uint8),
                                _cast(x, scale, FORMATS[f][1], FORMATS[f][0]).view(torch.uint8)) for f in FORMATS)
    failed = not same_cast
    device = torch.cuda.get_device_name()
    failed |= not report(device, torch.__version__, n, rows, same_cast)
    if o.json:
        o.json.write_text(json.dumps({"device": device, "torch": torch.__version__, "size": n,
                                      "tolerance": TOLERANCE, "rows": rows,
                                      "compiled_cast_bit_equal": same_cast}, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
