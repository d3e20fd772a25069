#!/usr/bin/python3
"""Reference values for dtrain's image layers, computed by PyTorch (the
oracle): Conv2d (3x3, the 7x7 stride-2 stem, 1x1 with and without stride,
3x3 stride 2), BatchNorm2d in training (output, gradients, running
averages) and evaluation, MaxPool2d (3x3 stride 2 pad 1, with ties) and the
global average pooling, each with a random output gradient.

Writes tests/fixtures/image_kernels_ref.bin: "DTFX", then records of
  u32 name length, name, u32 ndim, u32 dims[ndim], f32 values (row-major).
tests/test_image_kernels.c reads it. Debian's python3-torch (1.13) is enough:
  /usr/bin/python3 scripts/make_image_kernels_fixture.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture_arrays import write  # noqa: E402

torch.manual_seed(1234)
torch.set_num_threads(1)
records = []


def put(name, t):
    records.append((name, t.detach().float()))


def conv_case(name, N, C, H, W, OC, K, stride, pad, bias):
    conv = torch.nn.Conv2d(C, OC, K, stride=stride, padding=pad, bias=bias)
    x = torch.randn(N, C, H, W, requires_grad=True)
    y = conv(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    put(name + ".shape", torch.tensor([N, C, H, W, OC, K, stride, pad, int(bias)], dtype=torch.float32))
    put(name + ".x", x)
    put(name + ".w", conv.weight)
    if bias:
        put(name + ".b", conv.bias)
        put(name + ".db", conv.bias.grad)
    put(name + ".y", y)
    put(name + ".dy", dy)
    put(name + ".dx", x.grad)
    put(name + ".dw", conv.weight.grad)


conv_case("c3", 2, 3, 9, 7, 4, 3, 1, 1, True)
conv_case("c7", 2, 3, 16, 16, 8, 7, 2, 3, False)
conv_case("c1s2", 2, 8, 8, 8, 16, 1, 2, 0, False)
conv_case("c1", 2, 8, 5, 5, 6, 1, 1, 0, True)
conv_case("c3s2", 2, 4, 9, 9, 5, 3, 2, 1, False)

# BatchNorm2d: training step from given running averages, then evaluation with the updated ones
N, C, H, W = 3, 4, 5, 5
bn = torch.nn.BatchNorm2d(C, eps=1e-5, momentum=0.1)
with torch.no_grad():
    bn.weight.copy_(torch.rand(C) + 0.5)
    bn.bias.copy_(torch.randn(C))
    bn.running_mean.copy_(torch.randn(C))
    bn.running_var.copy_(torch.rand(C) + 0.5)
put("bn.shape", torch.tensor([N, C, H, W], dtype=torch.float32))
put("bn.w", bn.weight)
put("bn.b", bn.bias)
put("bn.rm0", bn.running_mean.clone())
put("bn.rv0", bn.running_var.clone())
x = (torch.randn(N, C, H, W) * 3 + 1).requires_grad_(True)
bn.train()
y = bn(x)
dy = torch.randn_like(y)
y.backward(dy)
put("bn.x", x)
put("bn.y", y)
put("bn.dy", dy)
put("bn.dx", x.grad)
put("bn.dw", bn.weight.grad)
put("bn.db", bn.bias.grad)
put("bn.rm1", bn.running_mean)
put("bn.rv1", bn.running_var)
bn.eval()
put("bn.yeval", bn(x))

# MaxPool2d 3x3 stride 2 pad 1 on values with ties (quarters), then the global average
N, C, H, W = 2, 3, 9, 9
x = (torch.randint(-8, 8, (N, C, H, W)).float() / 4).requires_grad_(True)
y = torch.nn.functional.max_pool2d(x, 3, stride=2, padding=1)
dy = torch.randn_like(y)
y.backward(dy)
put("mp.shape", torch.tensor([N, C, H, W, 3, 2, 1], dtype=torch.float32))
put("mp.x", x)
put("mp.y", y)
put("mp.dy", dy)
put("mp.dx", x.grad)

N, C, H, W = 2, 5, 4, 3
x = torch.randn(N, C, H, W, requires_grad=True)
y = torch.nn.functional.adaptive_avg_pool2d(x, (1, 1))
dy = torch.randn_like(y)
y.backward(dy)
put("ap.shape", torch.tensor([N, C, H, W], dtype=torch.float32))
put("ap.x", x)
put("ap.y", y)
put("ap.dy", dy)
put("ap.dx", x.grad)

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "image_kernels_ref.bin")
write(out, records)
print("wrote %s: %d arrays (torch %s)" % (out, len(records), torch.__version__))
