"""GPU calibration of the performance model: ``python repro/run.py mode=gpu_check calibrate=true``.

The measurements below feed :func:`system.simulator.hardware.hardware_from_profile`; the
runtime's correctness and throughput check lives in :mod:`repro.checks.gpu_check.run`, which
runs this module's :func:`run_calibration` by default on a GPU and imports its timing
primitives.

5. Achieved fraction of peak for the GPT3-1.3B stage shapes the paper's case 5 uses (5 layers,
   5 layers + head; micro-batch 1/2/4/8; forward, and backward with recomputation; bf16 and
   fp16 autocast), against the GPU's datasheet dense peak and the measured matmul peak.
6. Overlap: the slowdown of a stage's forward+backward while two side streams copy
   activation-sized tensors host<->device (the simulator assumes compute and transfers overlap
   at no cost).
7. The AdamW step over a 5-layer stage (fp32 master weights), as an implied memory bandwidth.

``calibration.json`` holds the measurements; ``hardware_profile.json`` an optional simulator
profile (:func:`system.simulator.hardware.hardware_from_profile`): the fraction of peak (bf16,
micro-batch 1, 5 layers with recomputation) carried to the V100 unchanged, and the optimizer
bandwidth scaled by the datasheet HBM ratio V100/GPU — both assumptions, stated in the file.
``sensitivity.json`` recomputes the case-5 ratios (ours vs Megatron / DeepSpeed, 24 layers,
batch 1024) under the default V100 model and under the profile.

``dry=true`` runs the same code on the CPU with a tiny model (seconds; tests use it): its
numbers say nothing about a GPU.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

__all__ = [
    "DATASHEET",
    "calibrate",
    "datasheet",
    "hardware_profile",
    "matmul_peak_tflops",
    "run_calibration",
    "sensitivity",
]


# Dense fp16/bf16 tensor-core peak (TFLOPS) and HBM bandwidth (GB/s) from NVIDIA's datasheets;
# matched against torch.cuda.get_device_name() in this order (first substring match wins).
DATASHEET = (
    ("H100 PCIe", 756.0, 2000.0),
    ("H200", 989.4, 4800.0),
    ("H100", 989.4, 3350.0),
    ("A100", 312.0, 2039.0),
    ("V100", 125.0, 900.0),
)
V100_PEAK_TFLOPS, V100_HBM_GBPS = 125.0, 900.0
MICRO_BATCHES = (1, 2, 4, 8)


def _time_cuda(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` on the current CUDA device (after 2 warm-up calls)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return statistics.median(times)


def matmul_peak_tflops(dtype: torch.dtype, n: int = 8192, repeats: int = 10) -> float:
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    return 2 * n**3 / _time_cuda(lambda: a @ b, repeats) / 1e12


def datasheet(device_name: str) -> tuple[float, float] | None:
    """(dense fp16/bf16 peak TFLOPS, HBM GB/s) of a GPU by name; None if not in the table."""
    for key, peak, hbm in DATASHEET:
        if key in device_name:
            return peak, hbm
    return None


def _timer(device: torch.device):
    """``time(fn, repeats)``: median seconds of ``fn()`` after 2 warm-up calls."""
    if device.type == "cuda":
        return _time_cuda

    def time_cpu(fn, repeats):
        for _ in range(2):
            fn()
        out = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
        return statistics.median(out)

    return time_cpu


def _stage(cfg, layers: int, head: bool, device: torch.device):
    from system.runtime.model import Block, Head

    mods = [Block(cfg, i) for i in range(layers)] + ([Head(cfg)] if head else [])
    return torch.nn.ModuleList(mods).to(device)


def stage_flops(cfg, layers: int, head: bool, mbs: int) -> tuple[float, float]:
    """(forward, backward-with-recomputation) FLOPs of a stage: the simulator's count
    (:mod:`system.simulator.hardware`): layers recompute their forward, the head does not."""
    from system.simulator.hardware import layer_forward_flops, logits_forward_flops

    f_layer = layers * layer_forward_flops(cfg, mbs)
    f_head = logits_forward_flops(cfg, mbs) if head else 0.0
    return f_layer + f_head, 3.0 * f_layer + 2.0 * f_head


def time_stage(
    cfg, stage, mbs: int, dtype: torch.dtype, device: torch.device, repeats: int = 5
) -> dict:
    """Seconds of one micro-batch's forward (checkpointed: inputs kept) and its backward
    (recomputes each block), under autocast ``dtype``."""
    x = torch.randn(mbs, cfg.seq_length, cfg.hidden_size, device=device, requires_grad=True)
    timer = _timer(device)
    state = {}

    def fwd():
        with torch.autocast(device.type, dtype=dtype):
            y = x
            for m in stage:
                if isinstance(m, torch.nn.Module) and m.__class__.__name__ == "Block":
                    y = torch.utils.checkpoint.checkpoint(m, y, use_reentrant=False)
                else:
                    y = m(y)
        state["y"] = y

    def bwd():
        state["y"].float().sum().backward()

    def both():
        fwd()
        bwd()

    t_fwd = timer(fwd, repeats)
    t_both = timer(both, repeats)
    return {"fwd_s": t_fwd, "bwd_s": max(t_both - t_fwd, 0.0), "fwd_bwd_s": t_both}


def overlap_slowdown(
    cfg, stage, mbs: int, dtype: torch.dtype, device: torch.device, repeats: int = 5
) -> dict:
    """Forward+backward time alone and while two side streams (CPU: threads) copy
    activation-sized tensors between host and device without pause."""
    import threading

    alone = time_stage(cfg, stage, mbs, dtype, device, repeats)["fwd_bwd_s"]
    shape = (mbs, cfg.seq_length, cfg.hidden_size)
    cuda = device.type == "cuda"
    host = [torch.empty(shape, dtype=dtype, pin_memory=cuda) for _ in range(2)]
    dev = [torch.empty(shape, dtype=dtype, device=device) for _ in range(2)]
    stop = threading.Event()

    def copier(k: int) -> None:
        stream = torch.cuda.Stream() if cuda else None
        while not stop.is_set():
            if cuda:
                with torch.cuda.stream(stream):
                    dev[k].copy_(host[k], non_blocking=True)
                    host[k].copy_(dev[k], non_blocking=True)
                stream.synchronize()
            else:
                dev[k].copy_(host[k])
                host[k].copy_(dev[k])

    threads = [threading.Thread(target=copier, args=(k,), daemon=True) for k in range(2)]
    for t in threads:
        t.start()
    try:
        busy = time_stage(cfg, stage, mbs, dtype, device, repeats)["fwd_bwd_s"]
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    nbytes = host[0].numel() * host[0].element_size()
    return {
        "micro_batch_size": mbs,
        "activation_bytes": nbytes,
        "alone_s": alone,
        "with_copies_s": busy,
        "slowdown": busy / alone,
    }


def optimizer_step(cfg, layers: int, device: torch.device, repeats: int = 5) -> dict:
    """AdamW over a ``layers``-layer stage's fp32 parameters: seconds and implied bandwidth (the
    simulator's bytes per parameter, ``system.simulator.hardware.ADAM_BYTES_PER_PARAM``)."""
    from system.simulator.hardware import ADAM_BYTES_PER_PARAM

    stage = _stage(cfg, layers, False, device)
    params = [p for p in stage.parameters()]
    for p in params:
        p.grad = torch.randn_like(p)
    kw = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW(params, lr=1e-4, **kw)
    t = _timer(device)(opt.step, repeats)
    n = sum(p.numel() for p in params)
    return {
        "layers": layers,
        "params": n,
        "step_s": t,
        "implied_bandwidth_bps": 8.0 * ADAM_BYTES_PER_PARAM * n / t,
    }


def sensitivity(profile: dict, *, trials: int = 4, time_limit_s: float = 20.0) -> list[dict]:
    """Case 5, 24 layers, batch 1024: ours (genetic schedule, small budget) against the best
    Megatron and DeepSpeed configurations under the V100 model and under ``profile``."""
    from baselines.deepspeed.perf import grid_search_deepspeed
    from baselines.megatron.perf import grid_search_megatron
    from system.cases import get_case
    from system.scheduler import schedule
    from system.simulator import V100, simulate_ours
    from system.simulator.hardware import hardware_from_profile
    from system.simulator.sharing import with_link_sharing
    from system.workload import Workload, get_model, tasklet_sizes

    # every pair its own pipe (link sharing ``pair``): the model this comparison was made under
    cluster = with_link_sharing(get_case("5"), "pair")
    wl = Workload(model=get_model("gpt3_xl", 24), global_batch_size=1024)
    pp, dp = 8, cluster.num_devices // 8
    assign = schedule(
        cluster, tasklet_sizes(wl, pp, dp), pp=pp, dp=dp, trials=trials, time_limit_s=time_limit_s
    ).assignment
    out = []
    for label, hw in (("V100 model", V100), ("hardware profile", hardware_from_profile(profile))):
        ours = simulate_ours(cluster, assign, wl, hardware=hw).iter_time_s
        meg = grid_search_megatron(cluster, wl, hw).best.iter_time_s
        ds = grid_search_deepspeed(cluster, wl, hw).best.iter_time_s
        out.append(
            {
                "hardware": label,
                "achievable_fraction": hw.achievable_fraction,
                "ours_s": ours,
                "megatron_s": meg,
                "deepspeed_s": ds,
                "ours_vs_megatron": meg / ours,
                "ours_vs_deepspeed": ds / ours,
            }
        )
    return out


def calibrate(*, dry: bool = False, repeats: int = 5) -> dict:
    """Items 5-7 of the module docstring; ``dry``: CPU, tiny model, float32/bfloat16."""
    import dataclasses

    from system.workload import MODELS

    if dry:
        device = torch.device("cpu")
        cfg = dataclasses.replace(
            MODELS["gpt3_xl"], hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=128
        )
        dtypes = {"bf16": torch.bfloat16}
        name, peak = "cpu (dry run)", None
    else:
        device = torch.device("cuda")
        cfg = MODELS["gpt3_xl"]
        dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
        name = torch.cuda.get_device_name(0)
        peak = datasheet(name)
    measured_peak = {k: matmul_peak_tflops(dt) for k, dt in dtypes.items()} if not dry else {}
    shapes = []
    for head in (False, True):
        stage = _stage(cfg, 5, head, device)
        f_fwd_by = {}
        for mbs in MICRO_BATCHES:
            f_fwd, f_bwd = stage_flops(cfg, 5, head, mbs)
            f_fwd_by[mbs] = (f_fwd, f_bwd)
            for key, dt in dtypes.items():
                t = time_stage(cfg, stage, mbs, dt, device, repeats)
                rec = {
                    "layers": 5,
                    "head": head,
                    "micro_batch_size": mbs,
                    "dtype": key,
                    **t,
                    "model_tflops": (f_fwd + f_bwd) / t["fwd_bwd_s"] / 1e12,
                }
                if peak:
                    rec["fraction_of_datasheet_peak"] = rec["model_tflops"] / peak[0]
                if key in measured_peak:
                    rec["fraction_of_matmul_peak"] = rec["model_tflops"] / measured_peak[key]
                shapes.append(rec)
        del stage
    stage = _stage(cfg, 5, False, device)
    overlap = [overlap_slowdown(cfg, stage, mbs, dtypes["bf16"], device, repeats) for mbs in (1, 4)]
    opt = optimizer_step(cfg, 5, device, repeats)
    return {
        "device": name,
        "dry": dry,
        "torch": torch.__version__,
        "datasheet_peak_tflops": peak[0] if peak else None,
        "datasheet_hbm_gbps": peak[1] if peak else None,
        "matmul_peak_tflops": measured_peak,
        "stages": shapes,
        "overlap": overlap,
        "optimizer": opt,
    }


def hardware_profile(cal: dict) -> dict:
    """The simulator profile of a calibration (module docstring, with its assumptions)."""
    base = [
        s
        for s in cal["stages"]
        if s["dtype"] == "bf16" and not s["head"] and s["micro_batch_size"] == 1
    ]
    frac = base[0].get("fraction_of_datasheet_peak") if base else None
    eq = {
        "assumption": "the fraction of datasheet peak measured here (bf16, micro-batch 1, 5 "
        "layers with recomputation) holds on a V100; the Adam step's bandwidth "
        "scales with datasheet HBM bandwidth (V100 900 GB/s)"
    }
    if frac is not None:
        eq["achievable_fraction"] = float(min(frac, 1.0))
    if cal.get("datasheet_hbm_gbps"):
        eq["hbm_bandwidth_bps"] = (
            cal["optimizer"]["implied_bandwidth_bps"] * V100_HBM_GBPS / cal["datasheet_hbm_gbps"]
        )
    return {
        "device": cal["device"],
        "dry": cal["dry"],
        "v100_equivalent": eq,
        "overlap_slowdown": {o["micro_batch_size"]: o["slowdown"] for o in cal["overlap"]},
    }


def run_calibration(out_dir: Path, *, dry: bool = False, repeats: int = 5) -> dict:
    from system.results import atomic_write_text

    cal = calibrate(dry=dry, repeats=repeats)
    prof = hardware_profile(cal)
    atomic_write_text(out_dir / "calibration.json", json.dumps(cal, indent=1) + "\n")
    atomic_write_text(out_dir / "hardware_profile.json", json.dumps(prof, indent=1) + "\n")
    sens = None
    if "achievable_fraction" in prof["v100_equivalent"]:
        sens = sensitivity(prof, trials=1 if dry else 4, time_limit_s=5.0 if dry else 20.0)
        atomic_write_text(out_dir / "sensitivity.json", json.dumps(sens, indent=1) + "\n")
    for s in cal["stages"]:
        frac = s.get("fraction_of_datasheet_peak")
        print(
            f"5 layers{' + head' if s['head'] else ''} mb={s['micro_batch_size']} "
            f"{s['dtype']}: fwd {1e3 * s['fwd_s']:.1f} ms, bwd {1e3 * s['bwd_s']:.1f} ms, "
            f"{s['model_tflops']:.1f} TFLOPS"
            + (f" = {100 * frac:.0f}% of datasheet peak" if frac else "")
        )
    for o in cal["overlap"]:
        print(f"overlap mb={o['micro_batch_size']}: x{o['slowdown']:.3f} with 2 copy streams")
    print(f"AdamW 5 layers: {1e3 * cal['optimizer']['step_s']:.1f} ms")
    for r in sens or []:
        print(
            f"case 5 under {r['hardware']}: ours vs Megatron {r['ours_vs_megatron']:.2f}x, "
            f"vs DeepSpeed {r['ours_vs_deepspeed']:.2f}x"
        )
    print(
        f"wrote {out_dir}/calibration.json, hardware_profile.json"
        + (", sensitivity.json" if sens else "")
    )
    return {"calibration": cal, "profile": prof, "sensitivity": sens}
