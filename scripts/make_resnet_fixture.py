#!/usr/bin/python3
"""Reference values for dtrain's ResNets, computed by torchvision (the
oracle): resnet18 (10 classes, 4 RGB images of 64x64) and dtrain's small ResNet
for 28x28 images (built from torchvision's BasicBlock: a 3x3 stem, three
stages of two blocks, 16/32/64 channels), both from the weights
dt_resnet_init_random gives (its splitmix64 draws reproduced here in
torchvision's parameter order), on a random batch:

- the first random batch on which PyTorch's own f32 gives its f64
  gradients (within 3e-5) and step losses (2e-5): near a ReLU's or a max
  pool's edge, f32 rounding decides where a gradient goes;
- one training forward and backward: logits, loss, BatchNorm running
  averages after it, every parameter's sum (the initialisation), and the
  gradients: whole for the small model; for resnet18 each tensor's largest
  magnitude and 32 evenly spaced entries (its 11.7M gradients would make a
  47 MB fixture);
- 10 steps of SGD with momentum 0.9 (lr 0.05; resnet18 0.005) on the same
  batch: the losses;
- the small ResNet trained 10 steps as a torchvision state dict in
  safetensors (resnet_small.safetensors) with its logits in evaluation and
  training mode, and two files dtrain must refuse (a misshaped and a
  missing tensor).

Writes tests/fixtures/resnet_ref.bin in test_image_kernels' format ("DTFX",
then named f32 arrays). Needs Debian's python3-torch and python3-torchvision:
  /usr/bin/python3 scripts/make_resnet_fixture.py
"""
import json
import os
import struct
import sys

import numpy as np
import torch
import torchvision

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
from dtrain_random import resnet_init  # noqa: E402
from fixture_arrays import write  # noqa: E402
from torch_resnet import build  # noqa: E402  (dtrain's resnet:small in torchvision's parts)

SEED = 1234
torch.set_num_threads(1)


init = resnet_init


def small_resnet():
    return build("resnet:small")


records = []


def put(name, t):
    records.append((name, torch.as_tensor(t).detach().float()))


def train_steps(model, x, y, lr, dtype):
    """The 10 SGD-momentum losses from the initialisation, in dtype."""
    init(model, SEED)
    model = model.to(dtype)
    for b in model.modules():
        if isinstance(b, torch.nn.BatchNorm2d):
            b.reset_running_stats()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for _ in range(10):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x.to(dtype)), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model.float(), losses


def gradients(model, x, y, dtype):
    init(model, SEED)
    model = model.to(dtype)
    model.train()
    logits = model(x.to(dtype))
    loss = torch.nn.functional.cross_entropy(logits, y)
    loss.backward()
    return model, logits, loss, [p.grad.double().reshape(-1) for p in model.parameters()]


def conditioned(make, x, y, lr):
    """Whether f32 gives f64's gradients and losses: a batch near a ReLU's or a
    max pool's edge makes f32 rounding flip which way a gradient goes (seen:
    4.8e-3 between PyTorch's own f32 and f64), and no f32 implementation
    could then be held to 1e-4."""
    g32 = gradients(make(), x, y, torch.float32)[3]
    g64 = gradients(make(), x, y, torch.float64)[3]
    wg = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(g32, g64))
    l32 = train_steps(make(), x, y, lr, torch.float32)[1]
    l64 = train_steps(make(), x, y, lr, torch.float64)[1]
    wl = max(abs(a - b) / abs(b) for a, b in zip(l32, l64))
    return wg, wl


def case(tag, make, shape, y, whole_grads, lr):
    """The first batch of shape whose f32 results are f64's (gradients within
    3e-5 of their largest, losses within 2e-5)."""
    for attempt in range(20):
        x = torch.randn(*shape)
        wg, wl = conditioned(make, x, y, lr)
        print("%s: batch %d: PyTorch f32 vs f64: gradients %.2g, 10 losses %.2g" % (tag, attempt, wg, wl))
        if wg < 3e-5 and wl < 2e-5:
            break
    else:
        raise SystemExit("%s: no well-conditioned batch in 20 draws" % tag)
    model, logits, loss, grads = gradients(make(), x, y, torch.float32)
    put(tag + ".x", x)
    put(tag + ".y", y.float())
    init(model, SEED)
    put(tag + ".psum", torch.tensor([p.double().sum().item() for p in model.parameters()]))
    put(tag + ".logits", logits)
    put(tag + ".loss", loss.reshape(1))
    if whole_grads:
        put(tag + ".grads", torch.cat(grads).float())
    else:
        rows = []
        for g in grads:
            idx = [i * g.numel() // 32 for i in range(32)]
            rows.append(torch.cat([g.abs().max().reshape(1), g[idx]]).float())
        put(tag + ".gsample", torch.stack(rows))
    put(tag + ".running", torch.cat([torch.cat([b.running_mean, b.running_var]) for b in model.modules()
                                     if isinstance(b, torch.nn.BatchNorm2d)]))
    put(tag + ".steps", torch.tensor(train_steps(make(), x, y, lr, torch.float32)[1]))


torch.manual_seed(5)
case("small", small_resnet, (4, 1, 28, 28), torch.tensor([3, 1, 4, 1]), True, 0.05)
# resnet18 learns 4 images within 3 steps at 0.05; at 0.005 its losses stay where a relative comparison means something
case("r18", lambda: torchvision.models.resnet18(num_classes=10), (4, 3, 64, 64), torch.tensor([7, 2, 9, 0]), False, 0.005)

def save_safetensors(path, tensors):
    """A state dict as safetensors (the format, written by hand: no package needed)."""
    header, data = {}, b""
    for name, t in tensors.items():
        b = t.detach().float().contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


# A torchvision state dict for dtrain to load: the small ResNet after its 10 steps (trained weights, running
# averages away from 0 and 1), with its logits on the small batch in evaluation and in training mode; and two
# files that must be refused: conv1.weight misshaped, and bn1.weight missing.
torch.manual_seed(6)
m = small_resnet()
init(m, SEED)
x = torch.randn(4, 1, 28, 28)
model, _ = train_steps(m, x, torch.tensor([3, 1, 4, 1]), 0.05, torch.float32)
sd = {k: v for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
fixtures = os.path.join(HERE, "..", "tests", "fixtures")
save_safetensors(os.path.join(fixtures, "resnet_small.safetensors"), sd)
model.eval()
put("sd.x", x)
put("sd.eval_logits", model(x))
model.train()
put("sd.train_logits", model(x))
save_safetensors(os.path.join(fixtures, "resnet_small_misshaped.safetensors"), {"conv1.weight": torch.zeros(16, 1, 5, 5)})
save_safetensors(os.path.join(fixtures, "resnet_small_missing.safetensors"), {"conv1.weight": sd["conv1.weight"]})

out = os.path.join(HERE, "..", "tests", "fixtures", "resnet_ref.bin")
write(out, records)
print("wrote %s: %d arrays (torch %s, torchvision %s)" % (out, len(records), torch.__version__, torchvision.__version__))
