#!/usr/bin/env python3
"""A small GPT-2-style BPE pair for the tokenizer tests, and the oracle's
encodings of test strings.

Trains a byte-level BPE (Hugging Face `tokenizers`, GPT-2's pre-tokeniser)
with 400 tokens on the GPL-3 text that Debian ships, writes it as GPT-2
distributes its tokenizer (encoder.json + vocab.bpe), and writes
tests/fixtures/bpe/expected.json: the ids the same library gives for each
test string. Needs `pip install tokenizers`.
"""
import json
import os
import tempfile

from tokenizers import ByteLevelBPETokenizer

TESTS = [
    "Hello world",
    "It's a test; we'll see: 123 + 4567 = 4690.",
    "  multiple   spaces\n\nnew lines\t tabs",
    "This License applies to any program or other work",
    "don't they're I've I'm you'll he'd",
    " leading space",
    "trailing space ",
    "x\n",
    "na\u00efve caf\u00e9 \u2014 \u201cquotes\u201d",
    "THE\tEND!!!   \n",
]


def main():
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "bpe")
    os.makedirs(here, exist_ok=True)
    tok = ByteLevelBPETokenizer()
    tok.train(files=["/usr/share/common-licenses/GPL-3"], vocab_size=400, min_frequency=2, show_progress=False)
    with tempfile.TemporaryDirectory() as d:
        vocab, merges = tok.save_model(d)
        os.replace(vocab, os.path.join(here, "encoder.json"))
        os.replace(merges, os.path.join(here, "vocab.bpe"))
    oracle = ByteLevelBPETokenizer(os.path.join(here, "encoder.json"), os.path.join(here, "vocab.bpe"))
    cases = [{"text": t, "ids": oracle.encode(t).ids} for t in TESTS]
    with open(os.path.join(here, "expected.json"), "w") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
    print(f"{len(cases)} cases, vocabulary {oracle.get_vocab_size()}; wrote {here}")


if __name__ == "__main__":
    main()
