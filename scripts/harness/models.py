"""The models the harnesses' Python peers (Lightning, Accelerate) train, written to match batchfit's:
every model of scripts/gpu-check.sh's peers (scripts/gpu_check/peers.py), and the MLP and Adam of the
side-by-side benchmark's Lightning module (benches/side_by_side/lightning_probe.py).

A model is described by a plain dict, the same one batchfit records as ``model.config.architecture`` in its
plan (``{"name": "resnet50", "image_size": 224, "classes": 1000}``, ``{"name": "gpt", "layers": 12,
"d_model": 768, "heads": 12, "seq_len": 1024, "vocab": 50257}``, ``{"name": "mlp", "input": 1024, "hidden":
[2048, 2048], "classes": 10}``), so a peer trains what batchfit trained:

* ResNet-18/50: torchvision's ``resnet18``/``resnet50`` (``weights=None``) when torchvision imports, else the
  built-in copy below (torchvision's layout, parameter names and initialisation, in-place ReLU). Which one
  ran is recorded (``model_source``). BatchNorm in train mode. Input ``randn[B,3,S,S]``, 1000 classes.
* GPT: GPT-2's layout as batchfit builds it (``src/models/gpt.rs``): token + position embeddings (N(0, 0.02)),
  pre-LayerNorm blocks with causal ``scaled_dot_product_attention`` and a 4x tanh-GELU MLP, final LayerNorm,
  LM head tied to the token embedding. ``gpt2-small`` is 12 layers, d 768, 12 heads, seq 1024, vocab 50257:
  124,439,808 parameters. Input: random tokens ``[B, seq+1]`` split into inputs and next-token targets.
* MLP: Linear/ReLU stack, as ``src/models/mlp.rs``.

Loss as batchfit's (``src/step.rs``): ``log_softmax(logits, dtype=float32)`` then the summed NLL divided by
the number of terms (samples, or tokens for the GPT). Optimizer: Adam, lr 1e-3, betas (0.9, 0.999), eps 1e-8,
no weight decay (batchfit's default ``--optimizer adam``).

Precisions: ``fp32``; ``amp-bf16`` = ``torch.autocast(device, bfloat16)`` around forward and loss with f32
weights (Lightning: ``precision="bf16-mixed"``); ``bf16`` = bf16 weights, inputs, gradients and Adam state
(Lightning: ``"bf16-true"``).

The one module of the package that imports torch when imported: only the Python children import it (peers.py;
lightning_probe.py once its data limit is set); the orchestrators (check.py, run.py) never do.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

LIGHTNING_PRECISION = {"fp32": "32-true", "amp-bf16": "bf16-mixed", "bf16": "bf16-true"}


# ------------------------------------------------------------------------------------------------------
# ResNet (torchvision layout; used when torchvision is not installed)
# ------------------------------------------------------------------------------------------------------

def _conv(ci, co, k, stride=1):
    return nn.Conv2d(ci, co, kernel_size=k, stride=stride, padding=k // 2, bias=False)


class _Basic(nn.Module):
    expansion = 1

    def __init__(self, c_in, width, stride):
        super().__init__()
        self.conv1, self.bn1 = _conv(c_in, width, 3, stride), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = _conv(width, width, 3), nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or c_in != width:
            self.downsample = nn.Sequential(_conv(c_in, width, 1, stride), nn.BatchNorm2d(width))

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + (x if self.downsample is None else self.downsample(x)))


class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, c_in, width, stride):
        super().__init__()
        out = width * 4
        self.conv1, self.bn1 = _conv(c_in, width, 1), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = _conv(width, width, 3, stride), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = _conv(width, out, 1), nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or c_in != out:
            self.downsample = nn.Sequential(_conv(c_in, out, 1, stride), nn.BatchNorm2d(out))

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    """torchvision.models.ResNet for resnet18 ([2,2,2,2] basic) and resnet50 ([3,4,6,3] bottleneck)."""

    def __init__(self, bottleneck, classes=1000):
        super().__init__()
        block = _Bottleneck if bottleneck else _Basic
        stages = [3, 4, 6, 3] if bottleneck else [2, 2, 2, 2]
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        c_in = 64
        for s, (n, width) in enumerate(zip(stages, [64, 128, 256, 512])):
            blocks = []
            for i in range(n):
                blocks.append(block(c_in, width, 2 if s > 0 and i == 0 else 1))
                c_in = width * block.expansion
            setattr(self, f"layer{s + 1}", nn.Sequential(*blocks))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(c_in, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def build_resnet(name, classes):
    """(module, source): torchvision's when it imports, else the built-in copy."""
    try:
        import torchvision  # noqa: F401
        from torchvision import models as tvm
    except Exception as e:  # noqa: BLE001 - any import failure means: use the copy
        return ResNet(name == "resnet50", classes), f"built-in torchvision-layout copy (torchvision: {type(e).__name__}: {e})"
    fn = getattr(tvm, name)
    return fn(weights=None, num_classes=classes), f"torchvision {torchvision.__version__}"


# ------------------------------------------------------------------------------------------------------
# GPT (batchfit's src/models/gpt.rs)
# ------------------------------------------------------------------------------------------------------

class _Attn(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)


class _Mlp(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.c_proj = nn.Linear(4 * d, d)


class GptBlock(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.attn = _Attn(d)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = _Mlp(d)

    def forward(self, h):
        b, t, d = h.shape
        hd = d // self.heads
        q, k, v = self.attn.c_attn(self.ln_1(h)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, hd).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=True)
        h = h + self.attn.c_proj(y.transpose(1, 2).reshape(b, t, d))
        return h + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(h)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, layers, d_model, heads, seq_len, vocab):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.02)
        self.h = nn.ModuleList(GptBlock(d_model, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)

    def forward(self, x):
        t = x.shape[1]
        h = self.wte(x) + self.wpe(torch.arange(t, device=x.device))
        for blk in self.h:
            h = blk(h)
        return F.linear(self.ln_f(h), self.wte.weight)  # LM head tied to the token embedding


# ------------------------------------------------------------------------------------------------------
# MLP (batchfit's src/models/mlp.rs)
# ------------------------------------------------------------------------------------------------------

def build_mlp(inp, hidden, classes):
    dims = [inp, *hidden, classes]
    layers = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i + 2 < len(dims):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


# ------------------------------------------------------------------------------------------------------
# common interface
# ------------------------------------------------------------------------------------------------------

def build(arch):
    """(module, source) for an architecture dict (batchfit's ``model.config.architecture``)."""
    name = arch["name"]
    if name in ("resnet18", "resnet50"):
        return build_resnet(name, int(arch.get("classes", 1000)))
    if name == "gpt":
        return Gpt(int(arch["layers"]), int(arch["d_model"]), int(arch["heads"]), int(arch["seq_len"]),
                   int(arch["vocab"])), "built-in (batchfit's GPT-2 layout)"
    if name == "mlp":
        return build_mlp(int(arch["input"]), [int(h) for h in arch["hidden"]], int(arch["classes"])), \
            "built-in (batchfit's MLP)"
    raise ValueError(f"no Python peer for model {name!r}")


def parameter_count(module):
    # tied weights are one parameter: Module.parameters() yields each tensor once
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def synthetic_batch(arch, n, device, float_dtype=torch.float32):
    """Inputs and targets generated on the device, as batchfit's Synthetic source does."""
    name = arch["name"]
    if name in ("resnet18", "resnet50"):
        s = int(arch["image_size"])
        return (torch.randn(n, 3, s, s, device=device, dtype=float_dtype),
                torch.randint(int(arch.get("classes", 1000)), (n,), device=device))
    if name == "gpt":
        tok = torch.randint(int(arch["vocab"]), (n, int(arch["seq_len"]) + 1), device=device)
        return tok[:, :-1], tok[:, 1:]
    if name == "mlp":
        return (torch.randn(n, int(arch["input"]), device=device, dtype=float_dtype),
                torch.randint(int(arch["classes"]), (n,), device=device))
    raise ValueError(name)


def loss_of(logits, y):
    """Mean over terms of the NLL of log_softmax in f32 (batchfit's class_loss)."""
    v = logits.shape[-1]
    lp = torch.log_softmax(logits.reshape(-1, v), dim=-1, dtype=torch.float32)
    y = y.reshape(-1)
    return F.nll_loss(lp, y, reduction="sum") / y.numel()


def adam(params):
    return torch.optim.Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)


def expected_parameters(arch):
    """Parameter count from the architecture alone (batchfit's formulas), for the model check."""
    name = arch["name"]
    if name == "gpt":
        L, d, s, v = (int(arch[k]) for k in ("layers", "d_model", "seq_len", "vocab"))
        block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
        return v * d + s * d + L * block + 2 * d
    if name == "mlp":
        dims = [int(arch["input"]), *[int(h) for h in arch["hidden"]], int(arch["classes"])]
        return sum(dims[i] * dims[i + 1] + dims[i + 1] for i in range(len(dims) - 1))
    return None


def describe(arch):
    name = arch["name"]
    if name in ("resnet18", "resnet50"):
        return f"{name} {arch['image_size']}x{arch['image_size']}"
    if name == "gpt":
        return f"gpt {arch['layers']}L d{arch['d_model']} {arch['heads']}h seq {arch['seq_len']} vocab {arch['vocab']}"
    if name == "mlp":
        return f"mlp {arch['input']}-{'-'.join(str(h) for h in arch['hidden'])}-{arch['classes']}"
    return name


def gib(b):
    return f"{b / 2 ** 30:.2f} GiB" if b is not None and not math.isnan(b) else "?"
