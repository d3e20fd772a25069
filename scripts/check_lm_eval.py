#!/usr/bin/env python3
"""lm-evaluation-harness against dtrain serve, transformers the oracle.

A random Llama (2 layers, 64 wide, 4 heads over 2 K/V heads; transformers' LlamaForCausalLM) with the byte-level BPE of
tests/fixtures/tokenizer/gpt2.json (GPT-2's pre-tokenizer, 2000 tokens, <|endoftext|> 0) as its tokenizer.json is saved as a Hugging Face folder and served by dtrain;
lm-evaluation-harness's `local-completions` model (its own request and parsing code: echo, logprobs 1, max_tokens 1,
token_logprobs[ctxlen:-1]) scores loglikelihood requests, rolling loglikelihoods (perplexity windows) and greedy
generations with a stop string; each against transformers' log_softmax and generate on the same folder.

Needs lm_eval, torch and transformers (the baselines' environment: scripts/make-baselines-venv.sh, then
`pip install lm_eval`):
  .venv-baselines/bin/python scripts/check_lm_eval.py build/dtrain [WORKDIR]
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import torch
from lm_eval.api.instance import Instance
from lm_eval.models.openai_completions import LocalCompletionsAPI
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT = ("The licenses for most software are designed to take away your freedom to share and change it. By contrast, "
        "the GNU General Public License is intended to guarantee your freedom to share and change free software.")
PAIRS = [("The licenses for most software are", " designed to take away your freedom"),
         ("By contrast, the GNU General Public License is", " intended to guarantee"),
         ("Question: what does the license guarantee?\nAnswer:", " your freedom to share"),
         ("free", " software"),
         ("The quick brown fox", " jumps over the lazy dog.")]


def make_folder(path):
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(HERE, "..", "tests", "fixtures", "tokenizer", "gpt2.json"),
                                  eos_token="<|endoftext|>")
    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
                      bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # logits spread enough that the greedy choices are not near-ties
        model.lm_head.weight.mul_(8)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model, tok


def serve(dtrain, folder, log):
    p = subprocess.Popen([dtrain, "serve", folder, "--port", "0", "--threads", "1", "--slots", "2"], stdout=log,
                         stderr=subprocess.STDOUT)
    for _ in range(300):
        time.sleep(0.1)
        m = re.search(r"listening on http://[^ ]*:(\d+)", open(log.name).read())
        if m:
            return p, int(m.group(1))
        if p.poll() is not None:
            break
    sys.exit("dtrain serve did not start: " + open(log.name).read())


def reference(model, ids, ctxlen):
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
    cont = ids[ctxlen:]
    rows = lp[ctxlen - 1:len(ids) - 1]
    total = sum(rows[i, t].item() for i, t in enumerate(cont))
    return total, all(rows[i].argmax().item() == t for i, t in enumerate(cont))


def main():
    dtrain = sys.argv[1]
    work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp()
    folder = os.path.join(work, "llama-gpt2-vocab")
    model, tok = make_folder(folder)
    log = open(os.path.join(work, "serve.log"), "w")
    proc, port = serve(dtrain, folder, log)
    try:
        lm = LocalCompletionsAPI(base_url="http://127.0.0.1:%d/v1/completions" % port, model="dtrain", tokenizer=folder,
                                 tokenizer_backend="huggingface", tokenized_requests=True, max_length=128, max_retries=1)
        reqs = [Instance("loglikelihood", {}, (c, x), i) for i, (c, x) in enumerate(PAIRS)]
        # the greedy continuation of a pair's context as its own continuation: is_greedy must come back true
        ctx = tok(PAIRS[0][0])["input_ids"]
        with torch.no_grad():
            g = model.generate(torch.tensor([ctx]), max_new_tokens=4, do_sample=False, pad_token_id=tok.eos_token_id)[0][len(ctx):]
        greedy = tok.decode(g)
        reqs.append(Instance("loglikelihood", {}, (PAIRS[0][0], greedy), len(reqs)))
        got = lm.loglikelihood(reqs)
        worst, agree = 0.0, 0
        print("| context | continuation | lm-eval via dtrain serve | transformers | is_greedy (both) |")
        print("|---|---|---|---|---|")
        for r, (lp, is_greedy) in zip(reqs, got):
            c, x = r.args
            ids_c = tok(c)["input_ids"]
            ids = ids_c + tok(x)["input_ids"]
            want, want_greedy = reference(model, ids, len(ids_c))
            worst = max(worst, abs(lp - want) / abs(want))
            agree += is_greedy == want_greedy
            print("| %r | %r | %.6f | %.6f | %s / %s |" % (c[-24:], x, lp, want, is_greedy, want_greedy))
        # perplexity: the rolling windows over a paragraph
        rolled = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (TEXT,), 0)])[0]
        ids = [tok.eos_token_id] + tok(TEXT)["input_ids"]
        want_roll, _ = reference(model, ids, 1)
        # generation: greedy until a stop string
        gen = lm.generate_until([Instance("generate_until", {}, (PAIRS[1][0], {"until": ["."], "max_gen_toks": 12}), 0)])[0]
        ctx = tok(PAIRS[1][0])["input_ids"]
        with torch.no_grad():
            out = model.generate(torch.tensor([ctx]), max_new_tokens=12, do_sample=False, pad_token_id=tok.eos_token_id)[0][len(ctx):]
        want_gen = tok.decode(out).split(".")[0]
        print("\nloglikelihood: worst relative difference %.2e, is_greedy agreeing %d of %d (the greedy continuation %r: %s)"
              % (worst, agree, len(reqs), greedy, got[-1][1]))
        print("loglikelihood_rolling over %d tokens: %.6f against transformers' %.6f (relative %.2e)"
              % (len(ids) - 1, rolled, want_roll, abs(rolled - want_roll) / abs(want_roll)))
        print("generate_until '.': %r against transformers' %r" % (gen, want_gen))
        ok = worst < 1e-4 and agree == len(reqs) and got[-1][1] and abs(rolled - want_roll) / abs(want_roll) < 1e-4 \
            and gen == want_gen
        print("ok" if ok else "FAILED")
        return 0 if ok else 1
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    sys.exit(main())
