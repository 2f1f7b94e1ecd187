"""mpgemm.fuse on real models as a user would run them: torchvision's
ResNet-18 and ResNet-50 and timm's ResNet-26 (conv -> batch norm chains),
torchvision's and timm's vision transformers, small (their MLP blocks as
mpgemm.mlp; timm's with SwiGLU MLPs as mpgemm.gated_mlp), prepared in fp16,
fused, and trained a few steps beside the same model in fp32 and under
torch.amp; the fused model's state_dict loads bitwise into the plain one
and back.

torchvision and timm do not install beside the CPU build of torch used in
CI (../shared/TOOLCHAIN.md has the separate environment where they do):
these tests run where they import (that environment, the GPU machine's
image)."""

import copy

import pytest
import torch
import torch.nn.functional as F

import mpgemm

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
STEPS = 4


def torchvision_resnet(depth):
    models = pytest.importorskip("torchvision.models", reason="torchvision does not install beside CPU torch here")
    return getattr(models, f"resnet{depth}")(num_classes=10)


def timm_resnet26():
    timm = pytest.importorskip("timm", reason="timm needs torchvision, which does not install beside CPU torch here")
    return timm.create_model("resnet26", pretrained=False, num_classes=10)


def torchvision_vit():
    models = pytest.importorskip("torchvision.models", reason="torchvision does not install beside CPU torch here")
    return models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
                                    mlp_dim=128, num_classes=10)


def timm_vit():
    timm = pytest.importorskip("timm", reason="timm needs torchvision, which does not install beside CPU torch here")
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2,
                             num_classes=10)


def timm_vit_swiglu():
    """timm's ViT with timm's SwiGLU (timm.layers.mlp) as each block's MLP."""
    timm = pytest.importorskip("timm", reason="timm needs torchvision, which does not install beside CPU torch here")
    from timm.layers.mlp import SwiGLU

    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2,
                             num_classes=10, mlp_layer=SwiGLU, act_layer=torch.nn.SiLU)


# name: (builder, chains: for the ResNets the stem, each block's convolutions
# and its downsample's; for the ViTs each block's MLP, image size)
MODELS = {
    "torchvision resnet18": (lambda: torchvision_resnet(18), 1 + 8 * 2 + 3, 64),
    "torchvision resnet50": (lambda: torchvision_resnet(50), 1 + 16 * 3 + 4, 64),
    "timm resnet26": (timm_resnet26, 1 + 8 * 3 + 4, 64),
    "torchvision vit": (torchvision_vit, 2, 32),
    "timm vit": (timm_vit, 2, 32),
    "timm vit swiglu": (timm_vit_swiglu, 2, 32),
}


def train(model, optimizer, scaler, batches, autocast_device=None):
    losses = []
    for x, y in batches:
        with torch.autocast(autocast_device or "cpu", dtype=torch.float16, enabled=autocast_device is not None):
            loss = F.cross_entropy(model(x).float(), y)
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return torch.tensor(losses)


# The ResNets' blocks, each of whose first chain sums its input's two
# gradients in its dgrad with MPGEMM_DGRAD_ADDEND=1 (mpgemm/fusion/input_gradient.py).
RESNET_BLOCKS = {"torchvision resnet18": 8, "torchvision resnet50": 16, "timm resnet26": 8}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name, dgrad_addend", [(name, None) for name in MODELS] +
                         [(name, "1") for name in RESNET_BLOCKS])
def test_fused_model_trains_within_torch_amps_deviation(name, dgrad_addend, device, monkeypatch):
    """Also, for the ResNets, with MPGEMM_DGRAD_ADDEND=1: each block's first
    chain sums its input's gradients, one mpgemm._conv2d_grad_input_add a
    block in each backward."""
    if dgrad_addend:
        monkeypatch.setenv("MPGEMM_DGRAD_ADDEND", dgrad_addend)
    build, chains, size = MODELS[name]
    torch.manual_seed(0)
    base = build().to(device).to(memory_format=torch.channels_last)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 3, size, size, generator=g).to(device).to(memory_format=torch.channels_last),
                torch.randint(0, 10, (4,), generator=g).to(device)) for _ in range(STEPS)]

    def optimizer_of(model):
        return torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)

    fp32 = copy.deepcopy(base)
    fp32_losses = train(fp32, optimizer_of(fp32), None, batches)
    amp = copy.deepcopy(base)
    amp_losses = train(amp, optimizer_of(amp), torch.amp.GradScaler(device), batches, autocast_device=device)
    fused = copy.deepcopy(base)
    fused, optimizer, scaler = mpgemm.amp.prepare(fused, optimizer_of(fused))
    assert mpgemm.fuse(fused, batches[0][0]) is fused
    report = mpgemm.fusion_report(fused)
    assert len(report) == chains and all(r["fused"] for r in report), report
    summing = sum(r.get("sums_input_gradient", False) for r in report)
    assert summing == (RESNET_BLOCKS[name] if dgrad_addend else 0)
    sums = []
    real = torch.ops.mpgemm._conv2d_grad_input_add
    monkeypatch.setattr(torch.ops.mpgemm, "_conv2d_grad_input_add", lambda *args: sums.append(1) or real(*args))
    fused_losses = train(fused, optimizer, scaler, batches)
    assert len(sums) == STEPS * summing
    deviation = (amp_losses - fp32_losses).abs().max()
    assert (fused_losses - fp32_losses).abs().max() <= 2 * deviation + 1e-2 * fp32_losses.abs().max(), (
        fused_losses, amp_losses, fp32_losses)


@pytest.mark.parametrize("name", MODELS)
def test_fused_state_dict_loads_bitwise_into_the_plain_model_and_back(name):
    build, _, size = MODELS[name]
    torch.manual_seed(0)
    fused = build()
    x = torch.randn(2, 3, size, size)
    mpgemm.fuse(fused, x)
    F.cross_entropy(fused(x), torch.tensor([1, 2])).backward()  # running statistics of its own
    plain = build()
    plain.load_state_dict(fused.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), fused.state_dict().values()))
    again = build()
    mpgemm.fuse(again, x)
    again.load_state_dict(plain.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), plain.state_dict().values()))
    for m in (again, plain):
        m.eval()
    with torch.no_grad():
        torch.testing.assert_close(again(x), plain(x), rtol=1e-4, atol=1e-5)
