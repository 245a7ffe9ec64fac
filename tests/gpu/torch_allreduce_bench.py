"""torch.distributed (NCCL) all-reduce latency and bus bandwidth, the anchor for
//comm:all_reduce_bench: one process per GPU, bf16, sizes x4 from 2 KiB to 256 MiB, timed the
same way (a host loop of eager calls, synchronized at the end; 200 calls up to 1 MiB, else 20).

  python3 tests/gpu/torch_allreduce_bench.py --world=4
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    if rank == 0:
        print("torch %s world %d: %11s %10s %11s" % (torch.__version__, world, "bytes", "torch_us", "torch_GB/s"))
    size = 2048
    while size <= 256 << 20:
        x = torch.randn(size // 2, dtype=torch.bfloat16, device="cuda")
        iters = 200 if size <= (1 << 20) else 20
        for _ in range(5):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        us = (time.perf_counter() - start) / iters * 1e6
        if rank == 0:
            print("torch world %d: %11d %10.1f %11.1f" % (world, size, us, 2 * (world - 1) / world * size / us / 1e3))
        size *= 4
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    world = ap.parse_args().world
    mp.spawn(run, args=(world, 29700 + world), nprocs=world)
