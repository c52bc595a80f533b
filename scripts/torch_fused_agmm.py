#!/usr/bin/env python3
"""PyTorch's all-gather + matmul on the shapes of `taxfree bench all_gather_matmul`, for comparison
in the same device call.

Variants (each timed and checked against torch-bsp on the same inputs):
  torch-bsp           dist.all_gather_into_tensor (NCCL) + torch.matmul; gather_dim 1 adds the
                      copy that interleaves the [world, M, K/world] blocks into [M, K]
  torch-fused         torch.ops.symm_mem.fused_all_gather_matmul (symmetric memory, decomposed)
  torch-fused-native  the same with TORCH_SYMM_MEM_ENABLE_NATIVE_ASYNC_TP set (PyTorch uses its
                      CUTLASS kernel only where it expects it to win, 2048 < M <= 4096, gather_dim 0)
A variant the installed PyTorch cannot run for a shape (e.g. fused gather_dim 1 on older releases)
is reported with its error instead of a time.

Timing follows taxfree's harness: ranks aligned before every sample, back-to-back runs worth
~200 us per sample (at most 64 runs), median per run, the slowest rank's median reported.

Run with torchrun (torchrun --nproc-per-node 2 scripts/torch_fused_agmm.py --json OUT.json) or
standalone (python3 scripts/torch_fused_agmm.py --json OUT.json), which starts --nproc ranks itself.
Multicast (NVLS) stays off: TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NCCL_NVLS_ENABLE=0.
"""
import argparse
import datetime
import json
import math
import os
import socket
import statistics
import sys
import time

os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

VARIANTS = ["torch-bsp", "torch-fused", "torch-fused-native"]


def default_shapes():
    """(M, N, K, gather_dim, layout), as taxfree's default sweep."""
    out = []
    for layout in ("kn", "nk"):
        m = 1
        while m <= 1024:
            out.append((m, 3584, 8192, 1, layout))
            m *= 2
    for layout in ("nk", "kn"):
        for n in (4096, 7168):
            for m in (1024, 2048, 4096, 8192, 16384):
                out.append((m, n, 8192, 0, layout))
    return out


def parse_filter(text):
    kv = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        if key not in ("M", "N", "K", "gather_dim", "layout") or not value:
            sys.exit(f"--shape '{text}': expected key=value,... with keys M, N, K, gather_dim, layout")
        kv[key] = value
    return kv


def selected_shapes(filters, world):
    shapes = []
    explicit = [f for f in filters if all(k in f for k in ("M", "N", "K", "gather_dim"))]
    others = [f for f in filters if f not in explicit]
    for f in explicit:
        for layout in ("kn", "nk"):
            if f.get("layout", layout) == layout:
                shapes.append((int(f["M"]), int(f["N"]), int(f["K"]), int(f["gather_dim"]), layout))
    if not explicit or others:
        for s in default_shapes():
            named = dict(zip(("M", "N", "K", "gather_dim", "layout"), s))
            if others and not any(all(str(named[k]) == v for k, v in f.items()) for f in others):
                continue
            shapes.append(s)
    # The sharded dimension must split evenly.
    return [s for s in shapes if (s[0] if s[3] == 0 else s[2]) % world == 0]


def make_inputs(shape, dtype, rank, world, seed):
    m, n, k, gd, layout = shape
    gen = torch.Generator(device="cuda").manual_seed(seed * 1000 + rank)
    rows, cols = (m // world, k) if gd == 0 else (m, k // world)
    a_shard = torch.rand(rows, cols, generator=gen, device="cuda", dtype=torch.float32).mul_(2).sub_(1).to(dtype)
    if layout == "nk":  # a Linear weight [N, K]; the matmul takes its transpose
        b = torch.rand(n, k, generator=gen, device="cuda", dtype=torch.float32).mul_(2).sub_(1).to(dtype).t()
    else:
        b = torch.rand(k, n, generator=gen, device="cuda", dtype=torch.float32).mul_(2).sub_(1).to(dtype)
    return a_shard, b


def bsp(a_shard, b, gd, world):
    if gd == 0:
        a = a_shard.new_empty(a_shard.shape[0] * world, a_shard.shape[1])
        dist.all_gather_into_tensor(a, a_shard)
    else:
        blocks = a_shard.new_empty(world, a_shard.shape[0], a_shard.shape[1])
        dist.all_gather_into_tensor(blocks, a_shard)
        a = blocks.permute(1, 0, 2).reshape(a_shard.shape[0], -1)  # a copy: [M, world, K/world] -> [M, K]
    return a, torch.matmul(a, b)


def fused(a_shard, b, gd, group_name, native):
    if native:
        os.environ["TORCH_SYMM_MEM_ENABLE_NATIVE_ASYNC_TP"] = "1"
    else:
        os.environ.pop("TORCH_SYMM_MEM_ENABLE_NATIVE_ASYNC_TP", None)
    a, cs = torch.ops.symm_mem.fused_all_gather_matmul(a_shard, [b], gather_dim=gd, group_name=group_name)
    return a, cs[0]


def time_variant(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    single = time.perf_counter() - t0
    reps = torch.tensor([min(64, max(1, math.ceil(200e-6 / max(single, 1e-7))))], device="cuda")
    dist.all_reduce(reps, op=dist.ReduceOp.MAX)
    reps = int(reps.item())
    samples = []
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(iters):
        dist.barrier()
        torch.cuda.synchronize()
        start.record()
        for _ in range(reps):
            fn()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) * 1e3 / reps)  # us per run
    stats = torch.tensor([statistics.median(samples), min(samples), max(samples)], device="cuda", dtype=torch.float64)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)  # the slowest rank's
    return stats.tolist(), reps


def count_wrong(c, ref, a, a_ref, k, dtype):
    rtol = 1 / 64 if dtype == torch.bfloat16 else 1 / 512
    atol = rtol * 0.05 * math.sqrt(k / 9)
    wrong = (~torch.isclose(c.float(), ref.float(), rtol=rtol, atol=atol)).sum()
    if a is not None:
        wrong += (a.contiguous().view(torch.int16) != a_ref.contiguous().view(torch.int16)).sum()
    dist.all_reduce(wrong)
    return int(wrong.item())


def agree(ok):
    """True when `ok` holds on every rank (a collective: every rank calls it at the same point)."""
    t = torch.tensor([1 if ok else 0], device="cuda", dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def write_json(args, world, results):
    env = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_SYMM", "NVSHMEM", "CUDA_VISIBLE"))}
    doc = {"config": vars(args), "world": world, "torch": torch.__version__, "device": torch.cuda.get_device_name(),
           "nccl": str(torch.cuda.nccl.version()), "env": env, "results": results,
           "wrong_total": sum(r.get("nwrong", 0) for r in results)}
    with open(args.json + ".tmp", "w") as f:  # replaced whole: a run cut short leaves valid JSON
        json.dump(doc, f, indent=2)
    os.replace(args.json + ".tmp", args.json)


def worker(rank, world, args, master_port):
    if master_port is not None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port), RANK=str(rank),
                          WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    # A collective a peer never joins ends at this deadline (PyTorch's NCCL watchdog), not at the
    # device call's limit.
    timeout = datetime.timedelta(seconds=args.timeout)
    try:
        dist.init_process_group("nccl", device_id=torch.device("cuda", local), timeout=timeout)
    except TypeError:  # releases before device_id
        dist.init_process_group("nccl", timeout=timeout)
    group_name = dist.group.WORLD.group_name
    try:
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group
        enable_symm_mem_for_group(group_name)
    except Exception as e:  # newer releases enable it on first use
        if rank == 0:
            print(f"# enable_symm_mem_for_group: {e}")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    shapes = selected_shapes([parse_filter(f) for f in args.shape], world)
    results = []
    if rank == 0:
        print(f"# torch {torch.__version__}, {world} ranks, {torch.cuda.get_device_name()}, {args.dtype}, "
              f"iters {args.iters}, warmup {args.warmup}")
        print(f"# {'case':<34} {'variant':<20} {'time(us)':>10} {'min(us)':>10} {'TFLOP/s':>8} {'vs-bsp':>7} "
              f"{'#wrong':>7}  note")
    for shape in shapes:
        m, n, k, gd, layout = shape
        label = f"M={m} N={n} K={k} gd{gd} {layout}"
        a_shard, b = make_inputs(shape, dtype, rank, world, args.seed)
        a_ref, c_ref = bsp(a_shard, b, gd, world)
        base = None
        for variant in VARIANTS:
            row = {"case": label, "M": m, "N": n, "K": k, "gather_dim": gd, "layout": layout, "variant": variant,
                   "dtype": args.dtype}
            if variant == "torch-bsp":
                fn = lambda: bsp(a_shard, b, gd, world)  # noqa: E731
            else:
                native = variant == "torch-fused-native"
                fn = lambda native=native: fused(a_shard, b, gd, group_name, native)  # noqa: E731
            # This PyTorch may not run the variant here: say why. Every rank learns whether every
            # rank ran it before any goes on to a collective, so one rank's error cannot leave the
            # others waiting in one.
            error = None
            try:
                a_out, c_out = fn()
                torch.cuda.synchronize()
            except Exception as e:
                error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
            if agree(error is None):
                row["nwrong"] = count_wrong(c_out, c_ref, a_out, a_ref, k, dtype)
                (med, lo, hi), reps = time_variant(fn, args.warmup, args.iters)
                row.update(time_us={"median": med, "min": lo, "max": hi}, runs_per_sample=reps,
                           tflops=2.0 * m * n * k / (med * 1e-6) / 1e12)
                if variant == "torch-bsp":
                    base = med
                row["speedup_vs_torch_bsp"] = base / med if base else None
            else:
                row["error"] = error or "failed on another rank"
            results.append(row)
            if rank == 0:
                if "error" in row:
                    print(f"  {label:<34} {variant:<20} {'-':>10} {'-':>10} {'-':>8} {'-':>7} {'-':>7}  {row['error']}")
                else:
                    sp = row["speedup_vs_torch_bsp"]
                    print(f"  {label:<34} {variant:<20} {row['time_us']['median']:10.2f} {row['time_us']['min']:10.2f} "
                          f"{row['tflops']:8.1f} {(f'{sp:.2f}x' if sp else '-'):>7} {row['nwrong']:7d}")
                sys.stdout.flush()
        if rank == 0 and args.json:  # after every shape: a run cut short keeps what it measured
            write_json(args, world, results)
    if rank == 0 and args.json:
        write_json(args, world, results)
        print(f"# JSON: {args.json}")
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", help="write results as JSON to this file")
    p.add_argument("--shape", action="append", default=[],
                   help="key=value,... with keys M, N, K, gather_dim, layout (as taxfree bench --shape); repeatable")
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup", type=int, default=5)
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--nproc", type=int, default=2, help="ranks to start when not run under torchrun")
    p.add_argument("--timeout", type=float, default=120,
                   help="seconds a collective may wait for the other ranks before the job fails")
    args = p.parse_args()
    if "RANK" in os.environ:  # torchrun
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args, None)
        return
    if torch.cuda.device_count() < args.nproc:
        sys.exit(f"needs {args.nproc} GPUs, {torch.cuda.device_count()} visible")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(worker, args=(args.nproc, args, port), nprocs=args.nproc, join=True)


if __name__ == "__main__":
    main()
