"""GPU check of our runtime, for a session that has CUDA: ``python repro/gpu_check.py [out=DIR]``.

1. Correctness: the debug model trained on CUDA (fp32, NCCL) gives the CPU/gloo losses (pp=1 dp=1
   on every machine; pp=2, dp=2, pp2·dp2 when there are enough GPUs), within 1e-3 relative (GPU
   kernels sum in another order).
2. Mixed precision: fp16 autocast + dynamic loss scaling trains (finite, falling losses).
3. Peak: measured dense matmul TFLOPS (fp16 and bf16, 8192², median of 10).
4. Per-stage throughput: one pipeline stage of GPT3-1.3B (3 of 24 layers, h=2048, s=2048,
   micro-batch 1) forward + backward under fp16 autocast, with and without activation
   checkpointing, as model TFLOPS (Megatron's per-layer count 24·b·s·h²·(1 + s/(6h)) forward,
   ×3 for forward+backward, ×4 with recomputation) and as a fraction of the measured peak.

5.-7. Calibration (``calibrate=1``, also run by default on a GPU; ``cal_out=DIR``, default
   ``results/gpu/``; ``dry=1`` runs it on the CPU with a tiny model): :mod:`repro.gpu_calibration`.

Writes ``gpu_check.json`` (default ``results/runtime/``) and prints a table. Exits 0 with a note
when CUDA is absent (nothing to check), 1 when a correctness check fails.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from repro.gpu_calibration import _time_cuda, matmul_peak_tflops, run_calibration  # noqa: E402

__all__ = ["stage_throughput", "correctness", "main"]


def stage_throughput(layers: int = 3, checkpointing: bool = False, repeats: int = 5) -> dict:
    """Forward+backward of one GPT3-1.3B stage of ``layers`` blocks, fp16 autocast."""
    from system.runtime.model import Block
    from system.workload import MODELS

    cfg = MODELS["gpt3_xl"]
    h, s = cfg.hidden_size, cfg.seq_length
    blocks = torch.nn.Sequential(*(Block(cfg, i) for i in range(layers))).cuda()
    x = torch.randn(1, s, h, device="cuda", requires_grad=True)

    def step():
        with torch.autocast("cuda", dtype=torch.float16):
            y = x
            for blk in blocks:
                y = (
                    torch.utils.checkpoint.checkpoint(blk, y, use_reentrant=False)
                    if checkpointing
                    else blk(y)
                )
        y.float().sum().backward()

    t = _time_cuda(step, repeats)
    fwd_flops = layers * 24 * s * h * h * (1 + s / (6 * h))
    flops = fwd_flops * (4 if checkpointing else 3)
    return {
        "layers": layers,
        "checkpointing": checkpointing,
        "time_s": t,
        "tflops": flops / t / 1e12,
        "tokens_per_s": s / t,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
    }


def correctness(tol: float = 1e-3) -> list[dict]:
    """CUDA vs CPU losses of the debug model for the layouts this machine can hold."""
    from system.runtime.launch import launch
    from system.runtime.spec import RunSpec

    base = dict(model="debug", global_batch_size=8, iters=3, seed=0)
    ref = launch(RunSpec(**base, pp=1, dp=1), timeout_s=300)["losses"]
    n = torch.cuda.device_count()
    out = []
    for pp, dp in [(1, 1), (2, 1), (1, 2), (2, 2)]:
        if pp * dp > n:
            out.append({"pp": pp, "dp": dp, "status": f"skipped: needs {pp * dp} GPUs, have {n}"})
            continue
        t = time.monotonic()
        m = launch(RunSpec(**base, pp=pp, dp=dp, device="cuda"), timeout_s=300)
        rel = max(abs(a - b) / abs(b) for a, b in zip(m["losses"], ref, strict=True))
        out.append(
            {
                "pp": pp,
                "dp": dp,
                "cuda_losses": m["losses"],
                "cpu_losses": ref,
                "max_rel_diff": rel,
                "status": "ok" if rel < tol else "FAIL",
                "wall_s": time.monotonic() - t,
            }
        )
    m = launch(RunSpec(**base, pp=1, dp=1, device="cuda", amp=True, iters=8), timeout_s=300)
    finite = all(v == v and abs(v) != float("inf") for v in m["losses"])
    out.append(
        {
            "pp": 1,
            "dp": 1,
            "amp": True,
            "cuda_losses": m["losses"],
            "loss_scale": m["loss_scale"],
            "skipped_steps": m["skipped_steps"],
            "status": "ok" if finite and m["losses"][-1] < m["losses"][0] else "FAIL",
        }
    )
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out_dir, cal_dir, dry, do_cal, check = Path("results/runtime"), None, False, None, True
    for a in argv:
        key, _, val = a.partition("=")
        if key == "out" and val:
            out_dir = Path(val)
        elif key == "cal_out" and val:
            cal_dir = Path(val)
        elif key in ("dry", "calibrate", "check") and val in ("0", "1"):
            if key == "dry":
                dry = val == "1"
            elif key == "calibrate":
                do_cal = val == "1"
            else:
                check = val == "1"
        else:
            sys.stderr.write(
                f"error: unknown argument {a!r} (out=DIR, cal_out=DIR, dry=0|1, "
                "calibrate=0|1, check=0|1)\n"
            )
            return 2
    if dry:  # CPU only, tiny shapes: exercises the calibration code, measures nothing of a GPU
        run_calibration(cal_dir or out_dir / "dry", dry=True, repeats=2)
        return 0
    if not torch.cuda.is_available():
        print("CUDA is not available on this machine: nothing to check (run where a GPU is).")
        return 0
    if do_cal is not False:
        run_calibration(cal_dir or Path("results/gpu"))
    if not check:
        return 0
    from system.results import atomic_write_text

    report = {
        "device": torch.cuda.get_device_name(0),
        "gpus": torch.cuda.device_count(),
        "torch": torch.__version__,
    }
    report["correctness"] = correctness()
    report["peak_tflops"] = {
        "fp16": matmul_peak_tflops(torch.float16),
        "bf16": matmul_peak_tflops(torch.bfloat16),
    }
    report["stage"] = [stage_throughput(3, False), stage_throughput(3, True)]
    for st in report["stage"]:
        st["fraction_of_peak"] = st["tflops"] / report["peak_tflops"]["fp16"]
    atomic_write_text(out_dir / "gpu_check.json", json.dumps(report, indent=1))
    print(
        f"{report['device']} x{report['gpus']}  matmul peak fp16 "
        f"{report['peak_tflops']['fp16']:.0f} TFLOPS, bf16 {report['peak_tflops']['bf16']:.0f}"
    )
    for c in report["correctness"]:
        print(
            f"correctness pp={c['pp']} dp={c['dp']}{' amp' if c.get('amp') else ''}: {c['status']}"
            + (f" (max rel diff {c['max_rel_diff']:.2e})" if "max_rel_diff" in c else "")
        )
    for st in report["stage"]:
        print(
            f"stage of {st['layers']} GPT3-1.3B layers, ckpt={st['checkpointing']}: "
            f"{st['time_s'] * 1e3:.1f} ms/micro-batch, {st['tflops']:.0f} TFLOPS = "
            f"{100 * st['fraction_of_peak']:.0f}% of measured peak, {st['peak_mem_gib']:.1f} GiB"
        )
    print(f"wrote {out_dir / 'gpu_check.json'}")
    return 1 if any(c["status"] == "FAIL" for c in report["correctness"]) else 0


if __name__ == "__main__":
    sys.exit(main())
