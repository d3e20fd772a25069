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
