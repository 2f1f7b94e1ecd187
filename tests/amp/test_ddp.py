"""A prepared and fused model under DistributedDataParallel: 2 processes,
gloo, CPU. Every rank must take the same skip decision and keep the same
scale, also when only one rank's gradients overflow."""

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

WORLD_SIZE = 2
STEPS = 6
OVERFLOW_STEP, OVERFLOW_RANK = 3, 1


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, port, out_dir):
    import mpgemm

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        torch.manual_seed(0)  # same initial weights on every rank
        # A conv -> batch norm -> ReLU chain that mpgemm.fuse runs, before DDP wraps the model.
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                    torch.nn.Flatten(), torch.nn.Linear(48, 24), torch.nn.LayerNorm(24),
                                    torch.nn.ReLU(), torch.nn.Linear(24, 3))
        model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                                      init_scale=2.0**12, growth_interval=2)
        mpgemm.fuse(model, torch.randn(2, 3, 3, 4))
        assert [r["fused"] for r in mpgemm.fusion_report(model)] == [True]
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        torch.manual_seed(100 + rank)  # different data on every rank
        records = []
        for step in range(STEPS):
            x, y = torch.randn(16, 3, 3, 4), torch.randint(0, 3, (16,))
            scaler.scale(F.cross_entropy(ddp(x), y)).backward()
            if step == OVERFLOW_STEP and rank == OVERFLOW_RANK:
                model[0].weight.grad[0, 0] = float("inf")  # after the all-reduce: this rank only
            before = [m.detach().clone() for m in optimizer.master_params()]
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            moved = any(not torch.equal(b, m) for b, m in zip(before, optimizer.master_params()))
            records.append((scaler.get_scale(), moved, scaler.last_step_skipped))
        torch.save({"records": records, "masters": optimizer.master_params()}, os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_ddp_ranks_agree_on_skips_and_scale(tmp_path):
    mp.spawn(worker, args=(free_port(), str(tmp_path)), nprocs=WORLD_SIZE, join=True)
    results = [torch.load(tmp_path / f"{rank}.pt") for rank in range(WORLD_SIZE)]
    records = [r["records"] for r in results]
    assert records[0] == records[1], "ranks disagree on scale or skipped steps"
    skipped = [step for step, (_, moved, was_skipped) in enumerate(records[0]) if not moved]
    assert skipped == [OVERFLOW_STEP]
    assert [was_skipped for _, _, was_skipped in records[0]] == [s == OVERFLOW_STEP for s in range(STEPS)]
    scales = [scale for scale, _, _ in records[0]]
    assert scales[OVERFLOW_STEP] == scales[OVERFLOW_STEP - 1] / 2
    for a, b in zip(results[0]["masters"], results[1]["masters"]):
        assert torch.equal(a, b)
