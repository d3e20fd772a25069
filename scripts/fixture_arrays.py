"""Named f32 arrays in the DTFX format that tests/fixture_arrays.h reads:
"DTFX", then per array a u32 name length, the name, a u32 dimension count,
the u32 dimensions and the values (little-endian, row-major)."""
import struct


def write(path, records):
    """records: (name, tensor or array) pairs, in order."""
    with open(path, "wb") as f:
        f.write(b"DTFX")
        for name, t in records:
            a = t.detach().float().contiguous().numpy() if hasattr(t, "detach") else t
            f.write(struct.pack("<I", len(name)) + name.encode())
            f.write(struct.pack("<I", a.ndim) + struct.pack("<%dI" % a.ndim, *a.shape))
            f.write(a.astype("<f4").tobytes())
