"""Fused chains whose output the next chain's convolution (or a max pool)
recomputes in backward (mpgemm/fusion/recompute.py): which chains, training
bit for bit as with the outputs kept, what autograd no longer keeps, hooks
outside (offloading ones, checkpoints), an output changed before it is
saved, and what is refused (an output changed after, a second derivative, a
bad switch)."""

import collections
import copy
import gc
import warnings
import weakref

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import mpgemm
from mpgemm.fusion import fusion_report, recompute
from test_fuse import DEVICES, TimmBottleneck, tiny_resnet

# The chains of base_model whose output goes to the next chain's convolution (6.conv2's past timm's aa, an
# Identity) or a max pool alone.
RECOMPUTED = {"0", "4.conv1", "5.conv1", "6.conv1", "6.conv2"}
# Their outputs' consumers.
CONSUMERS = ("3", "4.conv2", "5.conv2", "6.conv2", "6.conv3")
SWITCH = "MPGEMM_RECOMPUTE_CHAIN_OUTPUTS"


def prepared_and_fused(base, x, dtype, on, monkeypatch, switch=SWITCH):
    """A copy of base under prepare(dtype), fused on x with `switch` on or
    off as given (None: unset)."""
    model = copy.deepcopy(base)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer, scaler = mpgemm.amp.prepare(model, optimizer, dtype=dtype, init_scale=2.0**10)
    if on is not None:
        monkeypatch.setenv(switch, "1" if on else "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mpgemm.fuse(model, x.to(dtype))
    monkeypatch.delenv(switch, raising=False)
    return model, optimizer, scaler


def base_model(device):
    """tiny_resnet with a max pool after its stem, as torchvision's ResNets,
    and 8 channels in its bottleneck: every chain's ReLU mask as bits in 16 bits."""
    torch.manual_seed(0)
    layers = list(tiny_resnet(channels=(3, 8, 16)))
    layers[5] = TimmBottleneck(16, 8)
    model = torch.nn.Sequential(*layers[:3], torch.nn.MaxPool2d(3, 1, 1), *layers[3:])
    return model.to(device).to(memory_format=torch.channels_last)


def batches(device, count, batch=4):
    return [torch.randn(batch, 3, 8, 8, device=device).to(memory_format=torch.channels_last) for _ in range(count)]


def test_the_chains_before_a_chains_convolution_recompute_their_outputs(monkeypatch):
    x = batches("cpu", 1)[0]
    for recomputing, want in ((True, RECOMPUTED), (False, set())):
        model, _, _ = prepared_and_fused(base_model("cpu"), x, torch.float16, recomputing, monkeypatch)
        report = fusion_report(model)
        assert {r["conv"] for r in report if r["output_recomputable"]} == want
        assert all(r["fused"] for r in report)


def count_made(monkeypatch):
    """A counter of the outputs recompute.make_output makes, by y's shape."""
    made, make = collections.Counter(), recompute.make_output

    def counted(y, *args):
        made[y.shape] += 1
        return make(y, *args)

    monkeypatch.setattr(recompute, "make_output", counted)
    return made


def train_both(runs, data, dtype, forward=lambda model, x: model(x)):
    """Steps each (model, optimizer, scaler) of runs on the same batches;
    asserts after each step that all give the same bits."""
    for step, x in enumerate(data):
        results = []
        for model, optimizer, scaler in runs:
            xi = x.to(dtype).requires_grad_()
            out = forward(model, xi)
            scaler.scale(out.float().square().mean()).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            results.append([out.detach(), xi.grad, *[p.detach().clone() for p in model.parameters()],
                            *model.state_dict().values()])
        for got, want in zip(*results):
            assert torch.equal(got, want), step


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_trains_bit_for_bit_as_with_the_outputs_kept(device, dtype, monkeypatch):
    base, data = base_model(device), batches(device, 3)
    runs = [prepared_and_fused(base, data[0], dtype, recomputing, monkeypatch) for recomputing in (True, False)]
    made = count_made(monkeypatch)
    train_both(runs, data, dtype)
    # Each output made again once a step, by the recomputing model alone.
    assert sum(made.values()) == len(RECOMPUTED) * len(data)


class Projection(torch.nn.Module):
    """A chain without a ReLU feeding the next chain's convolution (a linear bottleneck's projection)."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)
        self.conv2, self.bn2 = torch.nn.Conv2d(8, 8, 1, bias=False), torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn2(self.conv2(self.bn1(self.conv1(x)))))


def test_a_chain_without_a_relu_trains_bit_for_bit(monkeypatch):
    torch.manual_seed(0)
    base, data = Projection().to(memory_format=torch.channels_last), batches("cpu", 2)
    runs = [prepared_and_fused(base, data[0], torch.float16, recomputing, monkeypatch)
            for recomputing in (True, False)]
    assert [r["output_recomputable"] for r in fusion_report(runs[0][0])] == [True, False]
    made = count_made(monkeypatch)
    train_both(runs, data, torch.float16)
    assert sum(made.values()) == len(data)


def consumers_inputs(model):
    """Weak references to the inputs each consumer gets in a forward."""
    refs = {}
    for name in CONSUMERS:
        model.get_submodule(name).register_forward_pre_hook(
            lambda module, args, name=name: refs.__setitem__(name, weakref.ref(args[0])))
    return refs


@pytest.mark.parametrize("device", DEVICES)
def test_autograd_no_longer_keeps_the_recomputed_outputs(device, monkeypatch):
    # 32 images: the outputs outweigh the allocator's rounding of the shifts the recipes keep.
    x = batches(device, 1, batch=32)[0].half()
    kept, output_bytes = {}, 0
    for recomputing in (False, True):
        model, _, _ = prepared_and_fused(base_model(device), x, torch.float16, recomputing, monkeypatch)
        refs = consumers_inputs(model)
        gc.collect()
        before = torch.cuda.memory_allocated() if device == "cuda" else 0
        loss = model(x).float().square().mean()
        gc.collect()
        assert all((ref() is None) == recomputing for ref in refs.values()), recomputing
        if not recomputing:
            output_bytes = sum(ref().untyped_storage().nbytes() for ref in refs.values())
        kept[recomputing] = (torch.cuda.memory_allocated() - before) if device == "cuda" else 0
        loss.backward()
    if device == "cuda":
        assert kept[False] - kept[True] >= 0.9 * output_bytes > 0, (kept, output_bytes)


def test_an_output_changed_before_it_is_saved_is_saved_as_it_is(monkeypatch):
    """A consumer's pre-hook that scales its input in place: the convolution saves what it took."""
    data = batches("cpu", 2)
    runs = [prepared_and_fused(base_model("cpu"), data[0], torch.float16, recomputing, monkeypatch)
            for recomputing in (True, False)]
    def scale(module, args):
        args[0].mul_(2)

    for model, _, _ in runs:
        model.get_submodule("6.conv3").register_forward_pre_hook(scale)
    made = count_made(monkeypatch)
    train_both(runs, data, torch.float16)
    assert sum(made.values()) == (len(RECOMPUTED) - 1) * len(data)


def offloaded(kept):
    """Saved-tensor hooks that keep a copy of each tensor (as an offload to
    the CPU would), appending each original's weak reference to `kept`."""
    def pack(t):
        kept.append(weakref.ref(t))
        return t.clone()

    return torch.autograd.graph.saved_tensors_hooks(pack, lambda copy: copy)


def test_hooks_outside_get_every_tensor_kept(monkeypatch):
    """Every other tensor and the recipe's in the output's place go through
    hooks outside: under an offloading hook nothing of the forward's stays on
    the device, and backward gives the same bits."""
    data = batches("cpu", 2)
    runs = [prepared_and_fused(base_model("cpu"), data[0], torch.float16, recomputing, monkeypatch)
            for recomputing in (True, False)]
    made = count_made(monkeypatch)
    packed = {}

    def forward(model, x):
        kept = packed.setdefault(id(model), [])
        with offloaded(kept):
            out = model(x)
        gc.collect()
        # The parameters aside, nothing the hooks copied is alive but through them.
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        alive = [ref() for ref in kept if ref() is not None]
        assert all(t.untyped_storage().data_ptr() in params or t is x for t in alive), \
            [(tuple(t.shape), t.dtype) for t in alive if t.untyped_storage().data_ptr() not in params and t is not x]
        return out

    train_both(runs, data, torch.float16, forward)
    assert sum(made.values()) == len(RECOMPUTED) * len(data)
    # Each recomputed output's place holds its y, scale and shift: two tensors more each.
    recomputing, keeping = (len(packed[id(model)]) for model, _, _ in runs)
    assert recomputing == keeping + 2 * len(RECOMPUTED) * len(data)


def test_checkpointed_blocks_train_bit_for_bit(monkeypatch):
    """Blocks under torch's checkpoint, non-reentrant (saved-tensor hooks outside) and reentrant."""
    data = batches("cpu", 2)
    runs = [prepared_and_fused(base_model("cpu"), data[0], torch.float16, recomputing, monkeypatch)
            for recomputing in (True, False)]

    made = count_made(monkeypatch)

    def forward(model, x):
        for i, module in enumerate(model):
            x = checkpoint(module, x, use_reentrant=i == 5) if i in (4, 5) else module(x)
        return x

    train_both(runs, data, torch.float16, forward)
    # The children run one by one: the stem's chain is not fused, the blocks' four are.
    assert sum(made.values()) == (len(RECOMPUTED) - 1) * len(data)


def capture_input(model, name, into):
    model.get_submodule(name).register_forward_pre_hook(lambda module, args: into.append(args[0]))


def capture_output(model, name, into):
    model.get_submodule(name).register_forward_hook(lambda module, args, out: into.append(out))


@pytest.mark.parametrize("changed, capture, ours", [
    ("the chain's output", lambda model, into: capture_input(model, "6.conv3", into), "the chain's output"),
    ("its batch norm's input", lambda model, into: capture_output(model, "4.conv1", into), "the batch norm's input"),
    ("the consumer's weight", lambda model, into: into.append(model.get_submodule("4.conv2").weight),
     r"\[torch.HalfTensor \[8, 8, 3, 3\]\] is at version 1; expected version 0"),
], ids=["output", "y", "weight"])
def test_a_tensor_changed_in_place_is_refused_as_torch_refuses_it(changed, capture, ours, monkeypatch):
    x = batches("cpu", 1)[0].half()
    for recomputing in (True, False):
        model, _, _ = prepared_and_fused(base_model("cpu"), x, torch.float16, recomputing, monkeypatch)
        tensors = []
        capture(model, tensors)
        loss = model(x).float().square().mean()
        with torch.no_grad():
            tensors[0].add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation: " + (ours if recomputing else "")):
            loss.backward()


def test_a_second_derivative_is_refused(monkeypatch):
    """torch's convolutions (a model in fp16 but its batch norms) differentiate their backward."""
    monkeypatch.setenv(SWITCH, "1")
    model = base_model("cpu").half()
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.float()
    x = batches("cpu", 1)[0].half()
    mpgemm.fuse(model, x)
    loss = model(x).float().square().mean()
    with pytest.raises(RuntimeError, match=r"cannot be differentiated twice \(create_graph=True\); set "
                                           r"MPGEMM_RECOMPUTE_CHAIN_OUTPUTS=0"):
        torch.autograd.grad(loss, list(model.parameters()), create_graph=True)


def test_fp32_chains_keep_their_outputs(monkeypatch):
    """Without the ReLU's bits the chain's backward keeps its output: nothing to recompute."""
    monkeypatch.setenv(SWITCH, "1")
    monkeypatch.setattr(recompute, "make_output", lambda *args: pytest.fail("recomputed"))
    model = base_model("cpu")
    mpgemm.fuse(model, batches("cpu", 1)[0])
    model(batches("cpu", 1)[0]).square().mean().backward()
    assert {r["conv"] for r in fusion_report(model) if r["output_recomputable"]} == RECOMPUTED


def test_a_bad_switch_is_refused(monkeypatch):
    monkeypatch.setenv(SWITCH, "yes")
    with pytest.raises(ValueError, match=r"MPGEMM_RECOMPUTE_CHAIN_OUTPUTS must be '0' or '1', got 'yes'"):
        mpgemm.fuse(base_model("cpu"), batches("cpu", 1)[0])
