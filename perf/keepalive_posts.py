#!/usr/bin/env python3
"""keepalive_posts.py HOST:PORT N CONNS STREAM

N chat-completion POSTs (perf/post.lua's body, key `perf-key`) over CONNS keep-alive
connections, one thread each, answers read in full (Content-Length or chunked); exits 1
unless every answer is 200. A client for callgrind runs (perf/ab_instructions.sh) that
needs no load generator beyond python3: under valgrind the gateway is far slower than
this client.
"""
import socket, sys, threading
host, port = sys.argv[1].rsplit(':', 1); n = int(sys.argv[2]); conns = int(sys.argv[3]); stream = sys.argv[4] == '1'
body = ('{"model":"perf/gpt-4o-mini","stream":%s,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello to the load test in a few words please."}]}' % ('true' if stream else 'false')).encode()
req = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer perf-key\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (sys.argv[1].encode(), len(body))) + body
bad = []
def worker(k):
    s = socket.create_connection((host, int(port))); f = s.makefile('rb')
    for _ in range(k):
        s.sendall(req)
        status = f.readline()
        if b' 200 ' not in status: bad.append(status)
        clen = None; chunked = False
        while True:
            l = f.readline()
            if l in (b'\r\n', b''): break
            name, _, v = l.partition(b':')
            if name.lower() == b'content-length': clen = int(v)
            if name.lower() == b'transfer-encoding' and b'chunked' in v.lower(): chunked = True
        if clen is not None: f.read(clen)
        elif chunked:
            while True:
                size = int(f.readline().split(b';')[0], 16); f.read(size + 2)
                if size == 0: break
    s.close()
ts = [threading.Thread(target=worker, args=(n // conns + (1 if i < n % conns else 0),)) for i in range(conns)]
[t.start() for t in ts]; [t.join() for t in ts]
if bad: print("bad", len(bad), bad[:3]); sys.exit(1)
