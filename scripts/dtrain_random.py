"""dtrain's random numbers (src/base/random.c) in numpy, for the fixture
scripts that start PyTorch from the weights dtrain's initialisation gives:
splitmix64 (dt_rng_next) and Box-Muller's cosine normals (dt_rng_normal,
two draws each)."""
import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def splitmix(seed, first, n):
    """Outputs first .. first+n-1 of dtrain's dt_rng_next from seed."""
    with np.errstate(over="ignore"):
        k = np.arange(first + 1, first + n + 1, dtype=np.uint64)
        z = np.uint64(seed) + k * GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def normals(seed, first, n):
    """n of dt_rng_normal's values, its calls starting at call index first."""
    z = splitmix(seed, first, 2 * n)
    u1 = ((z[0::2] >> np.uint64(11)).astype(np.float64) + 1.0) / 9007199254740993.0
    u2 = (z[1::2] >> np.uint64(11)).astype(np.float64) / 9007199254740992.0
    return (np.sqrt(-2.0 * np.log(u1)) * np.cos(6.283185307179586 * u2)).astype(np.float32)


def uniforms(seed, first, n):
    """n of dt_rng_uniform's values in [0, 1), its calls starting at call index first."""
    z = splitmix(seed, first, n)
    return ((z >> np.uint64(40)).astype(np.float64) * (1.0 / 16777216.0)).astype(np.float32)


def resnet_init(model, seed):
    """dt_resnet_init_random on a torchvision-named ResNet (torch.nn parameters in torchvision's order):
    convolutions N(0, 2/(OC KH KW)) (two draws a normal); BatchNorm 1 and 0 (no draws); the head uniform in
    +-1/sqrt(in) (one draw a value), weight then bias."""
    import torch
    at = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            n = p.numel()
            if p.dim() == 4:
                v = normals(seed, at, n)
                at += 2 * n
                sd = np.sqrt(np.float32(2) / np.float32(p.shape[0] * p.shape[2] * p.shape[3]), dtype=np.float32)
                p.copy_(torch.from_numpy((v * sd).reshape(p.shape)))
            elif name.startswith("fc."):
                u = uniforms(seed, at, n)
                at += n
                bound = np.float32(1) / np.sqrt(np.float32(model.fc.weight.shape[1]), dtype=np.float32)
                p.copy_(torch.from_numpy(((np.float32(2) * u - np.float32(1)) * bound).reshape(p.shape)))
            else:
                p.fill_(0.0 if name.endswith(".bias") else 1.0)


def mlp_init(linears, seed):
    """dt_mlp_init_random on a list of torch.nn.Linear: each layer's weight then bias uniform in +-1/sqrt(in), one
    draw a value, layer after layer (seed 0 is 1)."""
    import torch
    at, seed = 0, seed or 1
    with torch.no_grad():
        for lin in linears:
            bound = np.float32(1) / np.sqrt(np.float32(lin.in_features), dtype=np.float32)
            for p in (lin.weight, lin.bias):
                u = uniforms(seed, at, p.numel())
                at += p.numel()
                p.copy_(torch.from_numpy(((np.float32(2) * u - np.float32(1)) * bound).reshape(p.shape)))
