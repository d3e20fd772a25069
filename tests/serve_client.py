#!/usr/bin/env python3
"""Clients for serve_checks.sh that curl cannot be: a slow one, one that
leaves mid-stream, and OpenAI's own Python package.

usage: serve_client.py slow PORT SECONDS      sends a body a byte every SECONDS/4; prints the status and body
       serve_client.py leave PORT JSON        a streamed request, closed after its first event; prints that event
       serve_client.py openai PORT PROMPT     complete, stream and stop, then chat whole and streamed, through the openai
                                              package; prints four lines
       serve_client.py calls PORT BODY        a chat request whole and streamed; prints of each the finish reason, the
                                              tool calls' names and arguments and the content, a JSON line
"""
import json
import socket
import sys
import time


def slow(port, seconds):
    body = b'{"prompt": "The", "max_tokens": 2}'
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body))
    reply = b""
    for i in range(len(body)):
        try:
            s.sendall(body[i:i + 1])
        except OSError:
            break
        time.sleep(seconds / 4)
        s.setblocking(False)
        try:
            reply += s.recv(65536)
        except BlockingIOError:
            pass
        s.setblocking(True)
        if reply:
            break
    s.settimeout(10)
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            reply += b
    except OSError:
        pass
    head, _, rest = reply.partition(b"\r\n\r\n")
    status = head.split(b" ")[1].decode() if head else "none"
    print(status, rest.decode(errors="replace").strip())


def leave(port, request):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    body = request.encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    got = b""
    while b"data: " not in got or not got.rstrip().endswith(b"}"):
        b = s.recv(4096)
        if not b:
            break
        got += b
    s.close()
    print(got.split(b"data: ", 1)[-1].split(b"\n", 1)[0].decode(errors="replace"))


def calls(port, body):
    import urllib.request

    def post(stream):
        b = dict(json.loads(body), stream=stream)
        req = urllib.request.Request("http://127.0.0.1:%d/v1/chat/completions" % port, json.dumps(b).encode())
        return urllib.request.urlopen(req, timeout=600).read().decode()

    c = json.loads(post(False))["choices"][0]
    m = c["message"]
    whole = [c["finish_reason"], [[t["function"]["name"], t["function"]["arguments"]] for t in m.get("tool_calls") or []], m["content"]]
    finish, got, content = None, [], None
    for line in post(True).splitlines():
        if line.startswith("data: ") and line.strip() != "data: [DONE]":
            ch = json.loads(line[6:])["choices"][0]
            d = ch["delta"]
            finish = ch["finish_reason"] or finish
            got += [[t["function"]["name"], t["function"]["arguments"]] for t in d.get("tool_calls") or []]
            content = (content or "") + d["content"] if d.get("content") else content
    print(json.dumps([whole, [finish, got, content]]))


def openai_client(port, prompt):
    import openai
    c = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="none", max_retries=0)
    r = c.completions.create(model="m", prompt=prompt, max_tokens=20, temperature=0)
    whole = r.choices[0].text
    streamed = "".join(ch.choices[0].text for ch in
                       c.completions.create(model="m", prompt=prompt, max_tokens=20, temperature=0, stream=True))
    word = whole[4:6]
    stop = c.completions.create(model="m", prompt=prompt, max_tokens=20, temperature=0, stop=[word])
    print(json.dumps(whole))
    print(json.dumps(streamed))
    print(json.dumps([stop.choices[0].text == whole[:whole.find(word)], stop.choices[0].finish_reason, word]))
    # chat: whole and streamed through the client's own types
    msgs = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": prompt}]
    chat = c.chat.completions.create(model="m", messages=msgs, max_tokens=20, temperature=0)
    chunks = list(c.chat.completions.create(model="m", messages=msgs, max_tokens=20, temperature=0, stream=True))
    cstream = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    print(json.dumps([chat.choices[0].message.role, chat.choices[0].message.content, cstream, chat.choices[0].finish_reason,
                      chunks[0].choices[0].delta.role, chunks[-1].choices[0].finish_reason]))
    # logprobs through the client's types: the prompt's scores (echo, no tokens drawn) and a chat's alternatives
    lp = c.completions.create(model="m", prompt=prompt, max_tokens=0, echo=True, logprobs=2).choices[0].logprobs
    clp = c.chat.completions.create(model="m", messages=msgs, max_tokens=5, temperature=0, logprobs=True,
                                    top_logprobs=2).choices[0].logprobs.content
    print(json.dumps([lp.token_logprobs[0], len(lp.tokens), all(x < 0 for x in lp.token_logprobs[1:]), len(clp),
                      [len(e.top_logprobs) for e in clp]]))
    # stream_options.include_usage: the last chunk has no choices and the usage, the others a null usage
    us = list(c.chat.completions.create(model="m", messages=msgs, max_tokens=7, temperature=0, stream=True,
                                        stream_options={"include_usage": True}))
    print(json.dumps([len(us[-1].choices), us[-1].usage.completion_tokens if us[-1].usage else None,
                      all(u.usage is None for u in us[:-1])]))
    # n: the client's choices, each its index
    nc = c.chat.completions.create(model="m", messages=msgs, max_tokens=4, n=3, seed=2)
    print(json.dumps([[x.index for x in nc.choices], nc.usage.completion_tokens]))


if __name__ == "__main__":
    what, port = sys.argv[1], int(sys.argv[2])
    if what == "slow":
        slow(port, float(sys.argv[3]))
    elif what == "leave":
        leave(port, sys.argv[3])
    elif what == "calls":
        calls(port, sys.argv[3])
    else:
        openai_client(port, sys.argv[3])
