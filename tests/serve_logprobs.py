"""dtrain serve's logprobs, checked from outside (serve_checks.sh runs it; the standard library only).

hf FIXTURE PORT: a server on the fixture's Hugging Face folder scores each row of the fixture's inputs (echo,
  max_tokens 0, logprobs 5); every token's log-probability against log_softmax of transformers' logits, and the five
  alternatives against transformers' five most likely; lm-evaluation-harness's loglikelihood request (max_tokens 1,
  logprobs 1, echo) answers an entry a prompt token and one for the token drawn; ignore_eos draws past the folder's
  end of text, min_tokens draws the second alternative where the end was first, stop_token_ids cuts after its token.
  Prints [worst relative error, rows'
  tokens whose top 5 agree, tokens].
same PORT PROMPT: on a byte-level model: a greedy completion's logprobs against the server's scores of the prompt
  and completion read as one prompt (the decoder's steps against its prefill); each drawn token its own first
  alternative; the streamed logprobs the whole answer's; a sampled completion's and one cut by a stop sequence
  likewise; a greedy answer under presence and frequency penalties and a logit_bias, each token the penalized most
  likely; n 3 choices each the single answer of its seed, whole and streamed; a chat answer's entries in the chat form, its tokens joined its content. Prints what failed, or "ok ...".
"""
import json
import math
import struct
import sys
import urllib.request


def tensors(path, names):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        out = {}
        for k in names:
            d = head[k]
            a, b = d["data_offsets"]
            f.seek(8 + n + a)
            out[k] = (struct.unpack("<%d%s" % ((b - a) // 4, "f" if d["dtype"] == "F32" else "i"), f.read(b - a)), d["shape"])
        return out


def post(port, body, path="/v1/completions"):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        if not body.get("stream"):
            return json.load(r)
        chunks = []
        for line in r:
            line = line.decode()
            if line.startswith("data: ") and line.strip() != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
        return chunks


def hf(fixture, port):
    t = tensors(fixture, ["inputs", "logits"])
    (inp, ishape), (lg, lshape) = t["inputs"], t["logits"]
    rows, T, V = ishape[0], ishape[1], lshape[2]
    worst, tops, ranked = 0.0, 0, 0
    for row in range(rows):
        ids = list(inp[row * T:(row + 1) * T])
        lp = post(port, {"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 5})["choices"][0]["logprobs"]
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None and len(lp["tokens"]) == T, lp
        pl = post(port, {"prompt": ids, "max_tokens": 0, "prompt_logprobs": 5})["choices"][0]["prompt_logprobs"]
        assert pl[0] is None and len(pl) == T and all(5 <= len(e) <= 6 for e in pl[1:]), pl
        # lm-evaluation-harness's loglikelihood request (local-completions): one token drawn, an entry for it even
        # where it ends the text, the prompt's read from [ctxlen:-1]
        h = post(port, {"prompt": [ids], "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0, "seed": 1234})
        h = h["choices"][0]["logprobs"]
        assert len(h["token_logprobs"]) == T + 1 and h["token_logprobs"][1:-1] == lp["token_logprobs"][1:], (h, lp)
        assert all(len(t) in (1, 2) for t in h["top_logprobs"][1:]), h
        for i in range(1, T):
            logits = lg[(row * T + i - 1) * V:(row * T + i) * V]
            m = max(logits)
            lse = m + math.log(sum(math.exp(x - m) for x in logits))
            want = logits[ids[i]] - lse
            worst = max(worst, abs(lp["token_logprobs"][i] - want) / abs(want))
            top = sorted(range(V), key=lambda v: (-logits[v], v))[:5]
            got = lp["top_logprobs"][i]  # the text of a byte below 128 is its character (NUL's U+FFFD: C strings hold none)
            key = [chr(v) if v else "\ufffd" for v in top]
            tops += all(k in got and abs(got[k] - (logits[v] - lse)) <= 1e-5 * abs(logits[v] - lse) for k, v in zip(key, top))
            # vLLM's prompt_logprobs: the token's entry (the echo's logprob, its rank among transformers' logits, ties
            # within 1e-5 either way) and the 5 likeliest ranked 1 to 5
            e = pl[i]
            own = e[str(ids[i])]
            eps = 1e-5 * max(abs(x) for x in logits)
            lo = 1 + sum(x > logits[ids[i]] + eps for x in logits)
            hi = 1 + sum(x > logits[ids[i]] - eps for v, x in enumerate(logits) if v != ids[i])
            assert own["logprob"] == lp["token_logprobs"][i] and lo <= own["rank"] <= hi, (i, own, lo, hi)
            assert all(e[str(v)]["rank"] == k + 1 and abs(e[str(v)]["logprob"] - (logits[v] - lse)) <= 1e-5 * abs(logits[v] - lse)
                       for k, v in enumerate(top) if v != ids[i]), (i, e, top)
            ranked += 1
    # vLLM's ignore_eos: this prompt's greedy answer ends at once (the folder's eos_token_id, 2); ignored, it runs to
    # max_tokens, the end drawn in its logprobs and left out of its text
    plain = post(port, {"prompt": [5, 6, 7, 8], "max_tokens": 6, "temperature": 0, "logprobs": 0})["choices"][0]
    on = post(port, {"prompt": [5, 6, 7, 8], "max_tokens": 6, "temperature": 0, "logprobs": 0, "ignore_eos": True})
    c = on["choices"][0]
    assert plain["finish_reason"] == "stop" and plain["logprobs"]["tokens"] == ["\x02"], plain
    assert c["finish_reason"] == "length" and on["usage"]["completion_tokens"] == 6 and c["logprobs"]["tokens"][0] == "\x02" \
        and "\x02" not in c["text"] and len(c["text"]) == 6 - c["logprobs"]["tokens"].count("\x02"), on
    # vLLM's min_tokens: the end cannot be drawn before 3 tokens: the first is the plain answer's second alternative
    top2 = post(port, {"prompt": [5, 6, 7, 8], "max_tokens": 6, "temperature": 0, "logprobs": 2})["choices"][0]
    alts = sorted(top2["logprobs"]["top_logprobs"][0].items(), key=lambda kv: -kv[1])
    m = post(port, {"prompt": [5, 6, 7, 8], "max_tokens": 6, "temperature": 0, "logprobs": 0, "min_tokens": 3})["choices"][0]
    assert alts[0][0] == "\x02" and m["logprobs"]["tokens"][0] == alts[1][0] and "\x02" not in m["logprobs"]["tokens"][:3], (alts, m)
    # vLLM's stop_token_ids: the ignore_eos answer cut at its first token after the end, that token's text kept
    i = next(k for k, t in enumerate(c["logprobs"]["tokens"]) if k > 0 and t != "\x02")
    t = c["logprobs"]["tokens"][i]
    cut = post(port, {"prompt": [5, 6, 7, 8], "max_tokens": 6, "temperature": 0, "logprobs": 0, "ignore_eos": True,
                      "stop_token_ids": [ord(t)]})["choices"][0]
    assert cut["logprobs"]["tokens"] == c["logprobs"]["tokens"][:i + 1] and cut["text"].endswith(t) and \
        cut["finish_reason"] == "stop", (cut, c)
    print(json.dumps([worst, tops, rows * (T - 1), ranked]))


def same(port, prompt):
    bad = []
    g = post(port, {"prompt": prompt, "max_tokens": 24, "temperature": 0, "logprobs": 3})["choices"][0]
    lp, text = g["logprobs"], g["text"]
    if "".join(lp["tokens"]) != text or len(lp["tokens"]) != len(text):
        bad.append("greedy: tokens %r against the text %r" % (lp["tokens"], text))
    for tok, x, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        first = max(top, key=top.get)
        if first != tok or top[tok] != x or len(top) != 3:
            bad.append("greedy: %r (%g) is not its own first of three alternatives %r" % (tok, x, top))
    if lp["text_offset"] != list(range(len(text))):
        bad.append("text_offset %r" % lp["text_offset"])
    # the decode steps' log-probabilities against the prefill's of the same text
    ids = [ord(c) for c in prompt + text]
    s = post(port, {"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 0})["choices"][0]["logprobs"]
    scored = s["token_logprobs"][len(prompt):]
    err = max(abs(a - b) for a, b in zip(lp["token_logprobs"], scored))
    if len(scored) != len(lp["token_logprobs"]) or err > 1e-5:
        bad.append("decoded %r against scored %r" % (lp["token_logprobs"], scored))
    # streamed: the chunks' entries are the whole answer's
    chunks = post(port, {"prompt": prompt, "max_tokens": 24, "temperature": 0, "logprobs": 3, "stream": True})
    joined = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for c in chunks:
        for k in joined:
            joined[k] += c["choices"][0]["logprobs"][k]
    if joined != lp:
        bad.append("streamed %r against whole %r" % (joined, lp))
    # sampled, and cut by a stop sequence: an entry a byte of the text that stays
    r = post(port, {"prompt": prompt, "max_tokens": 24, "temperature": 1, "seed": 7, "logprobs": 1})["choices"][0]
    ids = [ord(c) for c in prompt + r["text"]]
    s = post(port, {"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 0})["choices"][0]["logprobs"]
    if "".join(r["logprobs"]["tokens"]) != r["text"] or \
            max(abs(a - b) for a, b in zip(r["logprobs"]["token_logprobs"], s["token_logprobs"][len(prompt):])) > 1e-5:
        bad.append("sampled: %r against %r" % (r["logprobs"], s))
    stop = text[6:8]
    c = post(port, {"prompt": prompt, "max_tokens": 24, "temperature": 0, "logprobs": 0, "stop": [stop]})["choices"][0]
    if c["text"] != text[:text.find(stop)] or "".join(c["logprobs"]["tokens"]) != c["text"]:
        bad.append("stop %r: %r, tokens %r" % (stop, c["text"], c["logprobs"]["tokens"]))
    # OpenAI's penalties and logit_bias as the batcher applies them: each greedy choice the most likely of the model's
    # log-probabilities (the twenty listed: the rest lie below the least of them) less frequency_penalty times the
    # times it was drawn before and presence_penalty once, plus its bias (the plain answer's first token -100: never)
    pres, freq, banned = 0.6, 0.9, ord(text[0])
    q = post(port, {"prompt": prompt, "max_tokens": 24, "temperature": 0, "logprobs": 20, "presence_penalty": pres,
                    "frequency_penalty": freq, "logit_bias": {str(banned): -100}})["choices"][0]
    counts, worse = {}, []
    for i, (tok, top) in enumerate(zip(q["logprobs"]["tokens"], q["logprobs"]["top_logprobs"])):
        def score(t):
            v, n = ord(t), counts.get(ord(t), 0)
            return top[t] - freq * n - pres * (n > 0) - 100 * (v == banned)
        best = max(top, key=score)
        if "\ufffd" not in top and (score(tok) < score(best) - 1e-4 or score(tok) < min(top.values()) - 1e-4):
            worse.append((i, tok, best))
        counts[ord(tok)] = counts.get(ord(tok), 0) + 1
    if worse or chr(banned) in q["text"] or q["text"] == text:
        bad.append("penalties: %r (plain %r): not the penalized most likely at %r" % (q["text"], text, worse))
    # n choices: choice i is the single answer of seed + i, whole and streamed (its chunks by index), the usage summed
    many = post(port, {"prompt": prompt, "max_tokens": 12, "temperature": 1, "seed": 40, "n": 3, "logprobs": 1})
    alone = [post(port, {"prompt": prompt, "max_tokens": 12, "temperature": 1, "seed": 40 + i, "logprobs": 1})["choices"][0]
             for i in range(3)]
    chunks = post(port, {"prompt": prompt, "max_tokens": 12, "temperature": 1, "seed": 40, "n": 3, "stream": True,
                         "stream_options": {"include_usage": True}})
    streamed = ["", "", ""]
    for c in chunks[:-1]:
        streamed[c["choices"][0]["index"]] += c["choices"][0]["text"]
    got = [(c["index"], c["text"], c["logprobs"]) for c in many["choices"]]
    want = [(i, c["text"], c["logprobs"]) for i, c in enumerate(alone)]
    if got != want or streamed != [c["text"] for c in alone] or many["usage"]["completion_tokens"] != 36 or \
            chunks[-1]["usage"]["completion_tokens"] != 36 or chunks[-1]["choices"]:
        bad.append("n 3: %r against %r, streamed %r" % (got, want, streamed))
    # a chat's: OpenAI's content entries, each with its bytes and two alternatives
    ch = post(port, {"messages": [{"role": "user", "content": prompt}], "max_tokens": 16, "temperature": 0, "logprobs": True,
                     "top_logprobs": 2}, "/v1/chat/completions")["choices"][0]
    content = ch["logprobs"]["content"]
    if "".join(e["token"] for e in content) != ch["message"]["content"] or \
            any(len(e["top_logprobs"]) != 2 or e["bytes"] != [ord(e["token"])] or e["top_logprobs"][0]["token"] != e["token"]
                or e["top_logprobs"][0]["logprob"] != e["logprob"] for e in content):
        bad.append("chat: %r" % ch)
    print("\n".join(bad) if bad else "ok: %d greedy tokens (decoded against scored %.2g), streamed alike, sampled, stopped, "
          "penalized (%r), n 3 = three seeds, chat" % (len(lp["tokens"]), err, q["text"]))


if __name__ == "__main__":
    if sys.argv[1] == "hf":
        hf(sys.argv[2], int(sys.argv[3]))
    else:
        same(int(sys.argv[2]), sys.argv[3])
