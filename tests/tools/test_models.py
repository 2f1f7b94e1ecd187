"""The bench's models: ResNet-50 as torchvision defines it, its convolution
list, and the GPT-2-shaped block."""

import math

import pytest
import torch
import torch.nn.functional as F

import mpgemm
from mpgemm.tools import models

# torchvision's documented parameter count for resnet50.
RESNET50_PARAMETERS = 25_557_032
GPT2_BLOCK_PARAMETERS = 7_087_872  # 2 LayerNorms, c_attn, attn.c_proj, c_fc, mlp.c_proj, with biases

# ResNet-50's distinct convolutions at 224x224, worked out by hand from the
# paper's table (stages of 3, 4, 6, 3 bottlenecks of widths 64..512, stride
# on the 3x3 of the first bottleneck of stages 2-4, 1x1 projection shortcuts):
# (in, out, kernel, stride, padding, input size).
RESNET50_CONVOLUTIONS_224 = {
    (3, 64, 7, 2, 3, 224),
    (64, 64, 1, 1, 0, 56), (64, 64, 3, 1, 1, 56), (64, 256, 1, 1, 0, 56), (256, 64, 1, 1, 0, 56),
    (256, 128, 1, 1, 0, 56), (128, 128, 3, 2, 1, 56), (128, 512, 1, 1, 0, 28), (256, 512, 1, 2, 0, 56),
    (512, 128, 1, 1, 0, 28), (128, 128, 3, 1, 1, 28),
    (512, 256, 1, 1, 0, 28), (256, 256, 3, 2, 1, 28), (256, 1024, 1, 1, 0, 14), (512, 1024, 1, 2, 0, 28),
    (1024, 256, 1, 1, 0, 14), (256, 256, 3, 1, 1, 14),
    (1024, 512, 1, 1, 0, 14), (512, 512, 3, 2, 1, 14), (512, 2048, 1, 1, 0, 7), (1024, 2048, 1, 2, 0, 14),
    (2048, 512, 1, 1, 0, 7), (512, 512, 3, 1, 1, 7),
}


def torchvision_resnet50_state_shapes():
    """torchvision's resnet50 state_dict keys and shapes, from its layout."""
    shapes = {"conv1.weight": (64, 3, 7, 7)}

    def bn(name, c):
        shapes.update({f"{name}.weight": (c,), f"{name}.bias": (c,), f"{name}.running_mean": (c,),
                       f"{name}.running_var": (c,), f"{name}.num_batches_tracked": ()})

    bn("bn1", 64)
    in_c = 64
    for stage, (width, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)], start=1):
        for b in range(blocks):
            p = f"layer{stage}.{b}"
            shapes[f"{p}.conv1.weight"] = (width, in_c, 1, 1)
            shapes[f"{p}.conv2.weight"] = (width, width, 3, 3)
            shapes[f"{p}.conv3.weight"] = (4 * width, width, 1, 1)
            for i, c in ((1, width), (2, width), (3, 4 * width)):
                bn(f"{p}.bn{i}", c)
            if b == 0:
                shapes[f"{p}.downsample.0.weight"] = (4 * width, in_c, 1, 1)
                bn(f"{p}.downsample.1", 4 * width)
            in_c = 4 * width
    shapes.update({"fc.weight": (1000, 2048), "fc.bias": (1000,)})
    return shapes


@pytest.fixture(scope="module")
def resnet():
    return models.resnet50()


def test_resnet50_has_torchvisions_parameter_count(resnet):
    assert sum(p.numel() for p in resnet.parameters()) == RESNET50_PARAMETERS


def test_resnet50_state_dict_has_torchvisions_keys_and_shapes(resnet):
    ours = {k: tuple(v.shape) for k, v in resnet.state_dict().items()}
    assert ours == torchvision_resnet50_state_shapes()


def test_resnet50_is_v1_5_with_the_stride_on_the_3x3(resnet):
    for stage in ("layer2", "layer3", "layer4"):
        first = getattr(resnet, stage)[0]
        assert (first.conv1.stride, first.conv2.stride, first.downsample[0].stride) == ((1, 1), (2, 2), (2, 2))


def test_resnet50_output_shape_and_channels_last():
    model = models.resnet50(num_classes=7).eval().to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 64, 64).to(memory_format=torch.channels_last)
    with torch.no_grad():
        out = model(x)
    assert out.shape == (2, 7) and torch.isfinite(out).all()


def test_resnet50_convolutions_are_read_from_the_model():
    layers = models.resnet50_convolutions()
    assert len(layers) == len(set(layers)) == len(RESNET50_CONVOLUTIONS_224)
    assert set(layers) == RESNET50_CONVOLUTIONS_224
    assert layers[0] == (3, 64, 7, 2, 3, 224)
    # Input sizes follow the image size: 160 -> 80 after the stem, 40 after the pool.
    assert {layer[5] for layer in models.resnet50_convolutions(160)} == {160, 40, 20, 10, 5}


def test_bench_conv_suite_times_every_resnet50_convolution():
    from mpgemm.tools import benchmarks

    cases = benchmarks.gpu_suites()["conv"]
    resnet50 = [shape for case, shape in cases if case == "resnet50"]
    assert {shape[0] for shape in resnet50} == {32, 256}
    for batch in (32, 256):
        assert {shape[1:] for shape in resnet50 if shape[0] == batch} == RESNET50_CONVOLUTIONS_224
    # The rest are depthwise: (batch, c, c, kernel, stride, padding, size, groups = c), "same" padding, or
    # ResNeXt-50's grouped 3x3s: 4, 8 and 16 channels a group in 32 groups.
    depthwise = [shape for case, shape in cases if case not in ("resnet50", "resnext50")]
    assert depthwise and all(len(s) == 8 and s[1] == s[2] == s[7] and s[5] == s[3] // 2 for s in depthwise)
    grouped = [shape for case, shape in cases if case == "resnext50"]
    assert sorted(s[1] // s[7] for s in grouped) == [4, 8, 16]
    assert all(s[1] == s[2] and s[3] == 3 and s[5] == 1 and s[7] == 32 for s in grouped)


def test_resnet50_trains_a_step_under_prepare():
    model = models.resnet50(num_classes=10)
    reference = models.resnet50(num_classes=10)
    reference.load_state_dict(model.state_dict())
    x, y = torch.randn(4, 3, 64, 64), torch.randint(0, 10, (4,))
    F.cross_entropy(reference(x), y).backward()

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = model.fc.weight.detach().clone()
    model, optimizer, scaler = mpgemm.amp.prepare(model, optimizer, init_scale=2.0**8)
    assert len(mpgemm.converted_layers(model)) == 53 + 1  # every convolution and the classifier
    loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    assert torch.isfinite(loss) and not scaler.last_step_skipped
    # The first SGD step moves the fp32 master by -lr * grad: the fp32 model's gradient, up to fp16.
    master = next(m for p, m in zip(optimizer.model_params(), optimizer.master_params()) if p is model.fc.weight)
    step = (before - master.detach()) / 0.1
    assert F.cosine_similarity(step.flatten(), reference.fc.weight.grad.flatten(), dim=0) > 0.99
    assert model.fc.weight.dtype == torch.float16


def test_resnet50_matches_torchvision():
    torchvision = pytest.importorskip("torchvision")
    theirs = torchvision.models.resnet50().eval()
    ours = models.resnet50().eval()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x))


def test_transformer_block_shape_and_parameters():
    block = models.TransformerBlock()
    assert sum(p.numel() for p in block.parameters()) == GPT2_BLOCK_PARAMETERS
    assert block(torch.randn(2, 5, 768)).shape == (2, 5, 768)
    with pytest.raises(ValueError, match="d_model"):
        models.TransformerBlock(d_model=100, heads=12)


def test_transformer_block_matches_a_written_out_reference():
    block = models.TransformerBlock(d_model=64, heads=4, d_mlp=256).double()
    x = torch.randn(3, 10, 64, dtype=torch.float64)

    def attention(h):
        q, k, v = (t.view(3, 10, 4, 16).transpose(1, 2) for t in block.attn.c_attn(h).split(64, dim=2))
        scores = q @ k.transpose(-1, -2) / math.sqrt(16)
        scores = scores.masked_fill(torch.ones(10, 10, dtype=torch.bool).triu(1), float("-inf"))
        return block.attn.c_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(3, 10, 64))

    h = x + attention(F.layer_norm(x, (64,), block.ln_1.weight, block.ln_1.bias))
    mlp_in = F.layer_norm(h, (64,), block.ln_2.weight, block.ln_2.bias)
    expected = h + block.mlp.c_proj(F.gelu(block.mlp.c_fc(mlp_in), approximate="tanh"))
    torch.testing.assert_close(block(x), expected)


def test_transformer_block_trains_under_prepare():
    block = models.TransformerBlock(d_model=64, heads=4, d_mlp=256)
    optimizer = torch.optim.SGD(block.parameters(), lr=0.01, momentum=0.9)
    block, optimizer, scaler = mpgemm.amp.prepare(block, optimizer, init_scale=2.0**8)
    assert sorted(mpgemm.converted_layers(block)) == ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]
    x, target = torch.randn(2, 16, 64), torch.randn(2, 16, 64)
    before = [m.detach().clone() for m in optimizer.master_params()]
    loss = F.mse_loss(block(x), target)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    assert not scaler.last_step_skipped
    assert all(not torch.equal(b, m) for b, m in zip(before, optimizer.master_params()))


def test_training_gemms_are_the_products_nn_linear_trains_with():
    """Each linear's three GEMMs as torch's own nn.Linear runs them, read
    off the matrix products its forward and backward dispatch: (m, n, k) and
    each operand row- or column-major."""
    from torch.utils._python_dispatch import TorchDispatchMode

    def layout(t):
        return "col" if t.stride(0) == 1 and t.shape[0] > 1 else "row"

    class Products(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
                a, b = args[-2:]
                self.seen.append(((a.shape[0], b.shape[1], a.shape[1]), (layout(a), layout(b))))
            return func(*args, **(kwargs or {}))

    width = (("tiny", 8, 24),)
    tokens = 5
    expected = models.training_gemms(width, (tokens,))
    assert [label.split()[2:] for label, _, _ in expected] == [
        [linear, way] for linear in ("qkv", "attn-out", "mlp-up", "mlp-down") for way in ("forward", "dgrad", "wgrad")]
    for i, (fan_in, fan_out) in enumerate(((8, 24), (8, 8), (8, 24), (24, 8))):
        linear = torch.nn.Linear(fan_in, fan_out)
        x = torch.randn(tokens, fan_in, requires_grad=True)
        with Products() as products:
            linear(x).backward(torch.randn(tokens, fan_out))
        assert sorted(products.seen) == sorted((shape, layouts) for _, shape, layouts in expected[3 * i:3 * i + 3])
