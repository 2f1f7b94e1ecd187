"""The models of `bench train`: ResNet-50 and a GPT-2-small-shaped block.

`resnet50()` is torchvision's ResNet-50 (v1.5: the stride of a downsampling
bottleneck is on its 3x3 convolution) with torchvision's module names and
initialisation, so torchvision's state_dict loads into it unchanged. It is
written out here because torchvision's wheel is built against torch's CUDA
build and does not import beside the CPU build the tests run on.
`resnet50_convolutions()` lists its distinct convolutions, read from the
model itself, for the convolution benchmark.

`TransformerBlock` is one GPT-2-small block: pre-LayerNorm, causal
self-attention through F.scaled_dot_product_attention, GELU MLP, with
GPT-2's (nanoGPT's) module names, on nn.Linear so that mpgemm.convert() and
mpgemm.amp.prepare() put its products on mpgemm.

`training_gemms()` lists the GEMMs that training transformers of GPT-2
small's to Llama-7B's widths runs per block, each linear's forward, dgrad
and wgrad with its real operand layouts, for the GEMM sweeps.
"""

import torch
import torch.nn.functional as F
from torch import nn

RESNET50_STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))  # (width, blocks, stride)
EXPANSION = 4


class Bottleneck(nn.Module):
    def __init__(self, in_channels, width, stride=1, downsample=None):
        super().__init__()
        out_channels = width * EXPANSION
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += x if self.downsample is None else self.downsample(x)  # in place, as torchvision's
        return self.relu(out)


class ResNet50(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        in_channels = 64
        for index, (width, blocks, stride) in enumerate(RESNET50_STAGES, start=1):
            setattr(self, f"layer{index}", self._stage(in_channels, width, blocks, stride))
            in_channels = width * EXPANSION
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(in_channels, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    @staticmethod
    def _stage(in_channels, width, blocks, stride):
        downsample = None
        if stride != 1 or in_channels != width * EXPANSION:
            downsample = nn.Sequential(nn.Conv2d(in_channels, width * EXPANSION, 1, stride=stride, bias=False),
                                       nn.BatchNorm2d(width * EXPANSION))
        layers = [Bottleneck(in_channels, width, stride, downsample)]
        layers += [Bottleneck(width * EXPANSION, width) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet50(num_classes=1000):
    return ResNet50(num_classes)


def resnet50_convolutions(image_size=224):
    """ResNet-50's distinct convolutions in the order the forward meets them,
    as (in_channels, out_channels, kernel, stride, padding, input_size), read
    by hooks from a forward pass on the meta device (shapes only, no data)."""
    with torch.device("meta"):
        model = resnet50()
    seen = {}

    def record(conv, args):
        layer = (conv.in_channels, conv.out_channels, conv.kernel_size[0], conv.stride[0], conv.padding[0],
                 args[0].shape[-1])
        seen.setdefault(layer, None)

    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            m.register_forward_pre_hook(record)
    with torch.no_grad():
        model.eval()(torch.empty(1, 3, image_size, image_size, device="meta"))
    return list(seen)


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"CausalSelfAttention: d_model ({d_model}) must be a multiple of heads ({heads})")
        self.heads = heads
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        batch, seq, d_model = x.shape
        q, k, v = (t.view(batch, seq, self.heads, d_model // self.heads).transpose(1, 2)
                   for t in self.c_attn(x).split(d_model, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(batch, seq, d_model))


class MLP(nn.Module):
    def __init__(self, d_model, d_mlp):
        super().__init__()
        self.c_fc = nn.Linear(d_model, d_mlp)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's form
        self.c_proj = nn.Linear(d_mlp, d_model)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class TransformerBlock(nn.Module):
    """One pre-LayerNorm GPT-2 block; GPT-2 small's shape by default."""

    def __init__(self, d_model=768, heads=12, d_mlp=3072):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, d_mlp)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GatedMLP(nn.Module):
    """Llama's MLP: down(silu(gate(x)) * up(x)), no biases."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    """One Llama block without its rotary embedding (elementwise, the same
    under every way): RMSNorm, causal SDPA attention with bias-free
    projections, RMSNorm, the gated MLP; d_ff 8/3 of d_model rounded up to a
    multiple of 256 (2048 at GPT-2 small's 768)."""

    def __init__(self, d_model=768, heads=12):
        super().__init__()
        d_ff = -(-8 * d_model // 3 // 256) * 256
        self.input_layernorm = nn.RMSNorm(d_model, eps=1e-6)
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d_model, d_model, bias=False)
                                                              for _ in range(4))
        self.post_attention_layernorm = nn.RMSNorm(d_model, eps=1e-6)
        self.mlp = GatedMLP(d_model, d_ff)

    def forward(self, x):
        batch, seq, d_model = x.shape
        h = self.input_layernorm(x)
        q, k, v = (proj(h).view(batch, seq, self.heads, d_model // self.heads).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(y.transpose(1, 2).reshape(batch, seq, d_model))
        return x + self.mlp(self.post_attention_layernorm(x))


# (name, d_model, d_ff) of the transformers whose training GEMMs the sweeps
# time: MLP ratio 4 (GPT-2) and 8/3 (Llama-7B's 11008, rounded up to 256).
TRANSFORMER_WIDTHS = (("gpt2-small", 768, 3072), ("gpt2-medium", 1024, 4096), ("gpt2-xl", 1600, 6400),
                      ("llama-7b", 4096, 11008))
TRAINING_TOKENS = (2048, 16384)


def training_gemms(widths=TRANSFORMER_WIDTHS, tokens=TRAINING_TOKENS):
    """[(label, (m, n, k), (a_layout, b_layout))]: for each transformer and
    token count, each of a block's linears (x[T, in] @ W[out, in]^T: the
    attention's qkv, d -> 3d, and output, d -> d; the MLP's up, d -> d_ff,
    and down, d_ff -> d) three ways, as nn.Linear's forward and backward run
    them: forward y = x @ W^T (A row-major, B column-major: "row", "col"),
    dgrad dx = dy @ W ("row", "row") and wgrad dW = dy^T @ x ("col",
    "row"). Labels read "gpt2-small 2048 mlp-up wgrad"."""
    gemms = []
    for name, d_model, d_ff in widths:
        linears = (("qkv", d_model, 3 * d_model), ("attn-out", d_model, d_model), ("mlp-up", d_model, d_ff),
                   ("mlp-down", d_ff, d_model))
        for t in tokens:
            for linear, fan_in, fan_out in linears:
                gemms += [(f"{name} {t} {linear} forward", (t, fan_out, fan_in), ("row", "col")),
                          (f"{name} {t} {linear} dgrad", (t, fan_in, fan_out), ("row", "row")),
                          (f"{name} {t} {linear} wgrad", (fan_out, fan_in, t), ("col", "row"))]
    return gemms
