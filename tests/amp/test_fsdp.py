"""A converted model under FSDP2 (fully_shard with a MixedPrecisionPolicy:
16-bit parameters for compute, fp32 sharded parameters and reduction), on 2
processes (gloo, CPU) against the same run in one process: bf16 without
loss scaling, fp16 with mpgemm's LossScaler and with torch's
ShardedGradScaler on the sharded gradients, with an overflow in one rank's
shard that every rank must skip. And prepare() on a sharded model, or
sharding after prepare(), refused."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built in")

STEPS = 6
OVERFLOW_STEP = 3
RUNS = ("bf16", "fp16-mpgemm-scaler", "fp16-sharded-grad-scaler")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


def sharded_model(run):
    import mpgemm
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)  # the same initial weights on every rank and in every world size
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), Block(32), Block(32), torch.nn.Linear(32, 8))
    mpgemm.convert(model)
    dtype = torch.bfloat16 if run == "bf16" else torch.float16
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for block in model[1:3]:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def batch(step, rank, world_size):
    g = torch.Generator().manual_seed(step % 2)  # two batches, learnt by heart
    x, y = torch.randn(32, 16, generator=g), torch.randint(0, 8, (32,), generator=g)
    return x.chunk(world_size)[rank], y.chunk(world_size)[rank]


def train(run, rank, world_size):
    import mpgemm
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
    from torch.distributed.tensor import DTensor

    model = sharded_model(run)
    initial = {name: p.full_tensor().clone() for name, p in model.named_parameters()}
    assert all(isinstance(p, DTensor) and p.dtype == torch.float32 for p in model.parameters())
    assert len(mpgemm.converted_layers(model)) == 6
    # SGD, linear in the gradients, keeps the two runs' rounding differences small (Adam's would amplify them).
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    scaler = {"bf16": None, "fp16-mpgemm-scaler": mpgemm.amp.LossScaler(init_scale=2.0**12),
              "fp16-sharded-grad-scaler": ShardedGradScaler("cpu", init_scale=2.0**12)}[run]
    losses, scales = [], []
    for step in range(STEPS):
        x, y = batch(step, rank, world_size)
        out = model(x)
        assert out.dtype == (torch.bfloat16 if run == "bf16" else torch.float16)
        loss = F.cross_entropy(out.float(), y)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            if step == OVERFLOW_STEP and rank == world_size - 1:  # after the reduce-scatter: this rank's shard only
                model[0].weight.grad.to_local().view(-1)[0] = float("inf")
            scaler.step(optimizer)
            scaler.update()
            scales.append(scaler.get_scale())
        optimizer.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world_size)
    weights = {name: p.full_tensor() for name, p in model.named_parameters()}
    return {"losses": losses, "scales": scales, "weights": weights, "initial": initial}


def worker(rank, world_size, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        results = {run: train(run, rank, world_size) for run in RUNS}
        results["prepare"] = refused_prepare()
        results["shard after prepare"] = refused_step_after_sharding()
        torch.save(results, os.path.join(out_dir, f"{world_size}-{rank}.pt"))
    finally:
        dist.destroy_process_group()


def refused_prepare():
    import mpgemm

    model = sharded_model("bf16")
    try:
        mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    except TypeError as e:
        return str(e)
    return None


def refused_step_after_sharding():
    import mpgemm
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    fully_shard(model)  # shards the fp16 parameters the masters stand for
    scaler.scale(model(torch.randn(4, 16)).square().mean()).backward()
    try:
        scaler.step(optimizer)
    except RuntimeError as e:
        return str(e)
    return None


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    for world_size in (1, 2):
        mp.spawn(worker, args=(world_size, free_port(), str(out)), nprocs=world_size, join=True)
    return {(w, r): torch.load(out / f"{w}-{r}.pt") for w in (1, 2) for r in range(w)}


@pytest.mark.parametrize("run", RUNS)
def test_two_processes_train_as_one_does(results, run):
    one, ranks = results[1, 0][run], [results[2, r][run] for r in range(2)]
    assert ranks[0]["losses"] == ranks[1]["losses"] and ranks[0]["scales"] == ranks[1]["scales"]
    two = ranks[0]
    # Each rank's 16-bit gradients over half the batch, averaged in fp32: the one-process run up to 16-bit rounding.
    assert two["losses"] == pytest.approx(one["losses"], rel=2e-3)
    assert two["losses"][-2] < 0.85 * two["losses"][0]  # the same batch, four steps on
    for name, weight in one["weights"].items():
        moved = (weight - one["initial"][name]).abs().max().item()
        assert (two["weights"][name] - weight).abs().max().item() < 0.03 * moved, name
    if run != "bf16":
        # An inf in the last rank's shard alone: every rank skips that step and backs off once.
        assert one["scales"] == two["scales"] == [2.0**12] * OVERFLOW_STEP + [2.0**11] * (STEPS - OVERFLOW_STEP)


def test_mpgemms_scaler_on_sharded_gradients_is_torchs_sharded_grad_scaler(results):
    for world_size in (1, 2):
        ours, theirs = (results[world_size, 0][run] for run in RUNS[1:])
        assert ours["losses"] == theirs["losses"] and ours["scales"] == theirs["scales"]
        assert all(torch.equal(ours["weights"][name], w) for name, w in theirs["weights"].items())


def test_prepare_refuses_a_sharded_model_and_sharding_after_prepare(results):
    for rank in range(2):
        assert "4 of the model's 16-bit parameters with masters are no longer in the model" in \
            results[2, rank]["shard after prepare"]
        assert "the model's parameters are sharded (fully_shard or DTensor)" in results[2, rank]["prepare"]
        assert "mpgemm.convert(model) before fully_shard" in results[2, rank]["prepare"]
