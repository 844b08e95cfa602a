"""GPU check of our runtime, for a session that has CUDA:
``python repro/run.py mode=gpu_check results_dir=results/runtime calibration_dir=results/gpu``.

1. Correctness: the debug model trained on CUDA (fp32, NCCL) gives the CPU/gloo losses (pp=1 dp=1
   on every machine; pp=2, dp=2, pp2·dp2 when there are enough GPUs), within 1e-3 relative (GPU
   kernels sum in another order).
2. Mixed precision: fp16 autocast + dynamic loss scaling trains (finite, falling losses).
3. Peak: measured dense matmul TFLOPS (fp16 and bf16, 8192², median of 10).
4. Per-stage throughput: one pipeline stage of GPT3-1.3B (3 of 24 layers, h=2048, s=2048,
   micro-batch 1) forward + backward under fp16 autocast, with and without activation
   checkpointing, as model TFLOPS (Megatron's per-layer count 24·b·s·h²·(1 + s/(6h)) forward,
   ×3 for forward+backward, ×4 with recomputation) and as a fraction of the measured peak.

5.-7. Calibration (``calibrate=true``, also run by default on a GPU, into ``calibration_dir``;
   ``dry=true`` runs it on the CPU with a tiny model): :mod:`repro.studies.gpu_calibration.run`.

Writes ``gpu_check.json`` into ``results_dir`` and prints a table; ``check_runtime=false`` runs
only the calibration. Without CUDA it says so and checks nothing; a failed correctness check is
an error.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from repro.checks.gpu_check.config import GpuCheckConfig
from repro.studies.gpu_calibration.run import _time_cuda, matmul_peak_tflops, run_calibration

__all__ = ["stage_throughput", "correctness", "run"]


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


def run(cfg: GpuCheckConfig) -> dict:
    out_dir = Path(cfg.results_dir)
    cal_dir = Path(cfg.calibration_dir or cfg.results_dir)
    if cfg.dry:  # CPU only, tiny shapes: exercises the calibration code, measures nothing of a GPU
        run_calibration(cal_dir, dry=True, repeats=2)
        return {"dry": True}
    if not torch.cuda.is_available():
        print("CUDA is not available on this machine: nothing to check (run where a GPU is).")
        return {"cuda": False}
    if cfg.calibrate is not False:
        run_calibration(cal_dir)
    if not cfg.check_runtime:
        return {"cuda": True}
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
    failed = [c for c in report["correctness"] if c["status"] == "FAIL"]
    if failed:
        raise RuntimeError(f"gpu_check: {len(failed)} correctness check(s) failed: {failed}")
    return {"cuda": True, "device": report["device"]}
