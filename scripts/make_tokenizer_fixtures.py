#!/usr/bin/env python3
"""Fixtures for dtrain's tokenizer.json reader, made by Hugging Face `tokenizers` (the oracle).

Writes tests/fixtures/tokenizer/:
  text.txt.gz   a text of about 1.2 MB: the licenses Debian ships (base-files, sorted by name), then sentences drawn from
                a seeded generator over many scripts (Latin with accents, Greek, Cyrillic, Arabic, Hebrew, Devanagari,
                CJK, Hangul, emoji), numbers of every length, contractions in both cases ('S, 'll, 'VE), runs of spaces,
                tabs, \\r\\n and blank lines, and the tokenizers' special tokens inside the text;
  gpt2.json     a byte-level BPE of 2000 tokens trained on it with GPT-2's pre-tokenizer (ByteLevel, its regex), the
                special token <|endoftext|>;
  llama3.json   the same training with Llama 3's pre-tokenizer (Split by its regex, isolated, then ByteLevel without
                its regex), ignore_merges, the special tokens <|begin_of_text|>, <|end_of_text|>, <|eot_id|> and a
                TemplateProcessing that puts <|begin_of_text|> first;
  qwen2.json    Qwen 2's kind: an NFC normalizer, its pattern (digits one by one), <|endoftext|>, <|im_start|>,
                <|im_end|>;
  expected.json for each tokenizer: the ids of some short strings, and of the whole text (without the template's
                special tokens: encode(add_special_tokens=False)) as their count and FNV-1a 64 hashes of each block of
                4096 ids (little-endian uint32), so that a difference is found to its block.

Run with the baselines' environment (scripts/make-baselines-venv.sh):
  .venv-baselines/bin/python scripts/make_tokenizer_fixtures.py
"""
import glob
import gzip
import json
import os
import random
import struct

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "tokenizer")
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
          r"\s+(?!\S)|\s+")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")  # Qwen 2's: digits one by one
SHORT = [
    "Hello world",
    "It's a test; we'll see: 123 + 4567 = 4690.",
    "  multiple   spaces\n\nnew lines\t tabs",
    "don't THEY'RE I've I'M you'll he'd",
    " leading space",
    "trailing space ",
    "na\u00efve caf\u00e9 \u2014 \u201cquotes\u201d",
    "1234567890 12 1",
    "\u4f60\u597d\u4e16\u754c \u3053\u3093\u306b\u3061\u306f \ud55c\uad6d\uc5b4",
    "emoji \U0001F600\U0001F680 done",
    "cafe\u0301 caf\u00e9 \u1100\u1161",
    "line\r\nbreaks\r\n\r\n end",
    "<|endoftext|>special<|eot_id|> tokens<|begin_of_text|>",
]
WORDS = {
    "latin": "the of and to in is that for it with as was on be at by this had not are but from or have an they which one you "
             "were her all she there would their we him been has when who will more no if out so said what up its about into "
             "than them can only other new some could time these two may then do first any my now such like our over man me "
             "even most made after also did many before must through back years where much your way well down should because "
             "each just those people how too little state good very make world still own see men work long get here between "
             "both life being under never day same another know while last might us great old year off come since against go "
             "came right used take three".split(),
    "accents": "na\u00efve caf\u00e9 r\u00e9sum\u00e9 \u00fcber gro\u00df \u00e7a \u00f1and\u00fa \u00e5ngstr\u00f6m \u0142\u00f3d\u017a "
               "\u0161kola \u00feorn fa\u00e7ade co\u00f6perate".split(),
    "greek": "\u03b1\u03bb\u03c6\u03b1 \u03b2\u03ae\u03c4\u03b1 \u03ba\u03cc\u03c3\u03bc\u03bf\u03c2 \u03bb\u03cc\u03b3\u03bf\u03c2 "
             "\u0391\u03b8\u03ae\u03bd\u03b1".split(),
    "cyrillic": "\u043f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440 \u0441\u043b\u043e\u0432\u043e \u041c\u043e\u0441\u043a\u0432\u0430 "
                "\u0434\u0430\u043d\u043d\u044b\u0435".split(),
    "arabic": "\u0645\u0631\u062d\u0628\u0627 \u0627\u0644\u0639\u0627\u0644\u0645 \u0643\u062a\u0627\u0628".split(),
    "hebrew": "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd".split(),
    "devanagari": "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e \u0939\u093f\u0928\u094d\u0926\u0940".split(),
    "cjk": "\u4f60\u597d \u4e16\u754c \u6570\u636e \u8bad\u7ec3 \u6a21\u578b \u3053\u3093\u306b\u3061\u306f \u30c7\u30fc\u30bf".split(),
    "hangul": "\uc548\ub155\ud558\uc138\uc694 \uc138\uacc4 \ub370\uc774\ud130".split(),
    "emoji": "\U0001F600 \U0001F680 \u2764\ufe0f \U0001F44D\U0001F3FD \U0001F1EB\U0001F1F7".split(),
    # decomposed forms NFC composes (e + combining acute, a + diaeresis, Hangul jamo), beside composed ones
    "decomposed": "cafe\u0301 na\u0308ive \u1100\u1161\u11a8 A\u030angstro\u0308m \u00c5ngstr\u00f6m re\u0301sume\u0301".split(),
}
PUNCT = [".", ",", ";", ":", "!", "?", "...", " -", " \u2014", "'s", "'S", "'ll", "'VE", "'d", "'t", "'re", "'M", " (", ")", "\"",
         " \u201c", "\u201d", " #", " $", "%", " &", " *", " +", " =", " @"]
SPACES = [" ", " ", " ", " ", "  ", "   ", "\t", " \t ", "\n", "\n\n", "\r\n", " \n", "\u00a0", "\u3000"]
SPECIAL = ["<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>"]
WHOLE = ["\u0120multiple", "\u0120spaces", "\u0120tabs", "\u0120Moskva"]  # " multiple", ... as ByteLevel maps them


def make_text():
    parts = []
    for f in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(f):
            parts.append(open(f, encoding="utf-8", errors="replace").read())
    rng = random.Random(1234)
    scripts = list(WORDS)
    out, size = [], 0
    while size < 900_000:
        s = []
        for _ in range(rng.randint(3, 30)):
            r = rng.random()
            if r < 0.08:
                s.append(str(rng.randint(0, 10 ** rng.randint(1, 12))))
            elif r < 0.25:
                s.append(rng.choice(PUNCT))
            else:
                w = rng.choice(WORDS[rng.choice(scripts) if rng.random() < 0.3 else "latin"])
                s.append(w.upper() if rng.random() < 0.05 else w.capitalize() if rng.random() < 0.1 else w)
            s.append(rng.choice(SPACES) if rng.random() < 0.3 else " ")
        if rng.random() < 0.02:
            s.append(rng.choice(SPECIAL))
        line = "".join(s)
        out.append(line)
        size += len(line.encode())
    return "\n".join(parts) + "\n" + "".join(out)


def trained(text, pre, llama, qwen=False):
    tok = Tokenizer(models.BPE(ignore_merges=llama))
    if qwen:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    special = [SPECIAL[0]] + SPECIAL[4:] if qwen else SPECIAL[1:4] if llama else SPECIAL[:1]
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([text[i:i + 4096] for i in range(0, len(text), 4096)], trainer)
    if llama:
        # words that are tokens no merge makes (as Llama 3's vocabulary has): ignore_merges takes them whole
        j = json.loads(tok.to_str())
        vocab = j["model"]["vocab"]
        new = [w for w in WHOLE if w not in vocab]
        assert len(new) >= 2, "the words are tokens already: pick others"
        for w in new:
            vocab[w] = max(vocab.values()) + 1
        tok = Tokenizer.from_str(json.dumps(j))
        bos = "<|begin_of_text|>"
        tok.post_processor = processors.TemplateProcessing(single=bos + " $A", pair=bos + " $A " + bos + " $B",
                                                           special_tokens=[(bos, tok.token_to_id(bos))])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def fnv(ids):
    h = 14695981039346656037
    for b in struct.pack("<%dI" % len(ids), *ids):
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def main():
    os.makedirs(OUT, exist_ok=True)
    text = make_text()
    with gzip.GzipFile(os.path.join(OUT, "text.txt.gz"), "wb", mtime=0) as f:
        f.write(text.encode())
    pres = {
        "gpt2": pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        "llama3": pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
                                           pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
        "qwen2": pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2), behavior="isolated", invert=False),
                                          pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
    }
    expected = {}
    for name, pre in pres.items():
        tok = trained(text, pre, name == "llama3", name == "qwen2")
        tok.save(os.path.join(OUT, name + ".json"))
        ids = tok.encode(text, add_special_tokens=False).ids
        blocks = [fnv(ids[i:i + 4096]) for i in range(0, len(ids), 4096)]
        expected[name] = {"short": {s: tok.encode(s, add_special_tokens=False).ids for s in SHORT},
                          "text_ids": len(ids), "block": 4096, "hashes": blocks,
                          "bos": tok.encode("x").ids[0] if name == "llama3" else None}
        print("%s: %d tokens, the text's %d bytes in %d ids" % (name, tok.get_vocab_size(), len(text.encode()), len(ids)))
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
