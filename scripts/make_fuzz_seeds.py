#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora (tests/fuzz/corpus/<harness>/): a few small
valid files of each format, so that fuzzing starts from inputs that reach deep
into each loader. Plain Python, no dependencies: python3 scripts/make_fuzz_seeds.py"""
import gzip, json, os, struct

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fuzz", "corpus")

def put(harness, name, data):
    d = os.path.join(root, harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)

def bf16(x):
    return struct.unpack("<I", struct.pack("<f", x))[0] >> 16

# a tiny GPT-2: T 4, V 8 (padded 8), L 1, NH 1, C 4
T, V, Vp, L, NH, C = 4, 8, 8, 1, 1, 4
sizes = [Vp * C, T * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C, L * C, L * C, L * 4 * C * C, L * 4 * C,
         L * C * 4 * C, L * C, C, C]
params = [((i * 37) % 17 - 8) / 16.0 for i in range(sum(sizes))]
hdr = [20240326, 3, T, V, L, NH, C, Vp] + [0] * 248
put("llmc", "tiny_f32.bin", struct.pack("<256i", *hdr) + struct.pack("<%df" % len(params), *params))
hdr[1] = 5
put("llmc", "tiny_bf16.bin", struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(params), *[bf16(p) for p in params]))

toks = [(i * 7) % 50 for i in range(40)]
put("tokens", "u16.bin", struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)) + struct.pack("<%dH" % len(toks), *toks))
put("tokens", "u32.bin", struct.pack("<256i", 20240801, 7, len(toks), *([0] * 253)) + struct.pack("<%dI" % len(toks), *toks))

# the same tiny model as safetensors with HF names
names = [("wte.weight", [V, C]), ("wpe.weight", [T, C])]
for l in range(L):
    names += [(f"h.{l}.ln_1.weight", [C]), (f"h.{l}.ln_1.bias", [C]), (f"h.{l}.attn.c_attn.weight", [C, 3 * C]),
              (f"h.{l}.attn.c_attn.bias", [3 * C]), (f"h.{l}.attn.c_proj.weight", [C, C]), (f"h.{l}.attn.c_proj.bias", [C]),
              (f"h.{l}.ln_2.weight", [C]), (f"h.{l}.ln_2.bias", [C]), (f"h.{l}.mlp.c_fc.weight", [C, 4 * C]),
              (f"h.{l}.mlp.c_fc.bias", [4 * C]), (f"h.{l}.mlp.c_proj.weight", [4 * C, C]), (f"h.{l}.mlp.c_proj.bias", [C])]
names += [("ln_f.weight", [C]), ("ln_f.bias", [C])]
for dtype, es in (("F32", 4), ("BF16", 2)):
    header, body, off = {"__metadata__": {"format": "pt", "n_head": str(NH)}}, b"", 0
    for n, shape in names:
        count = 1
        for d in shape:
            count *= d
        vals = [((off + i) % 13 - 6) / 8.0 for i in range(count)]
        data = struct.pack("<%df" % count, *vals) if es == 4 else struct.pack("<%dH" % count, *[bf16(v) for v in vals])
        header[n] = {"dtype": dtype, "shape": shape, "data_offsets": [len(body), len(body) + len(data)]}
        body += data
        off += count
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    put("safetensors", f"tiny_{dtype.lower()}.safetensors", struct.pack("<Q", len(h)) + h + body)

images = bytes([0, 0, 8, 3]) + struct.pack(">III", 3, 2, 2) + bytes(range(12))
labels = bytes([0, 0, 8, 1]) + struct.pack(">I", 3) + bytes([0, 1, 2])
put("idx", "images.gz", gzip.compress(images, mtime=0))
put("idx", "labels.gz", gzip.compress(labels, mtime=0))
put("idx", "images_plain", images)

# BPE: encoder.json NUL vocab.bpe NUL text (GPT-2's byte characters: space is U+0120)
enc = {c: i for i, c in enumerate("abcdeh\u0120")}
enc.update({"ab": 7, "\u0120a": 8, "abc": 9, "he": 10})
merges = "#version: 0.2\na b\n\u0120 a\nab c\nh e\n"
put("bpe", "small", json.dumps(enc).encode() + b"\0" + merges.encode() + b"\0" + b"abc a he's abcde  ab\n")

put("config", "deepspeed.json", json.dumps({
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "train_batch_size": 8, "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10, "total_num_steps": 100, "warmup_type": "linear"}},
}).encode())
put("config", "cosine.json", json.dumps({
    "optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": True}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 5, "total_num_steps": 50, "cos_min_ratio": 0.01}},
    "steps": 20}).encode())

put("metrics", "run.jsonl", b'{"step":1,"loss":5.5,"lr":0.001}\n{"step":2,"loss":null,"grad_norm":null}\n'
    b'{"step":3,"loss":4.25,"val_loss":4.5}\n')

# a checkpoint manifest of tests/fuzz/fuzz_ckpt.c's model (T 4, V 16, L 1, NH 2, C 8, AdamW), whose
# parameter and optimizer files hold zeros: the hashes are those of zeros, so a seed passes every check
def fnv_zeros(words):
    h = 1469598103934665603
    for _ in range(words):
        h = (h * 1099511628211) % (1 << 64)
    return "%016x" % h

T, V, L, NH, C = 4, 16, 1, 2, 8
n = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
tensors = [{"name": "wte", "hf": "wte.weight", "unit": 0, "offset": 0, "shape": [V, C]}]
put("ckpt", "manifest.json", json.dumps({
    "format": "dtrain-checkpoint", "version": 1, "step": 1,
    "model": {"kind": "gpt2", "max_seq_len": T, "vocab_size": V, "padded_vocab_size": V, "num_layers": L,
              "num_heads": NH, "channels": C, "parameters": n},
    "optimizer": {"kind": "adamw", "steps": 1, "buffers": 2, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
                  "weight_decay": 0, "momentum": 0, "nesterov": False},
    "schedule": {"kind": "constant", "lr": 0.0003, "lr_min": 0, "warmup": 0, "total": 10},
    "settings": {"steps": 10, "batch": 4, "seq": 64, "grad_accum": 1, "ranks": 1, "strategy": "single",
                 "grad_clip": 0, "seed": 1337},
    "data": {"path": "train.bin", "tokens": 1000, "tokens_per_batch": 256, "epoch": 0, "next_batch": 1},
    "rng": {"shuffle_seed": "0", "shuffle_epoch": 0},
    "files": {"params.f32": {"bytes": 4 * n, "fnv1a64": fnv_zeros(n)},
              "optim.f32": {"bytes": 8 * n, "fnv1a64": fnv_zeros(2 * n)}},
    "tensors": tensors}, indent=1).encode())
