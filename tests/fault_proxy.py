#!/usr/bin/env python3
"""fault_proxy.py — an HTTP proxy on loopback that forwards GETs (and their
Range header) to an upstream server and injects the faults a remote
dataset must survive, for tests/test_remote.c:

  reset N AFTER   the next N file responses stop after AFTER body bytes
                  with a TCP reset (SO_LINGER 0): a connection lost mid-frame;
                  with then=CODE every request after the last reset gets
                  HTTP CODE (a store that goes down mid-transfer)
  status N CODE   the next N requests get HTTP CODE (503: a busy store);
                  with skip=K, once K more file responses were served
  stall N SECONDS the next N file responses send half their body, then
                  nothing for SECONDS (a link that stops moving)
  rate BYTES      every response from now on trickles at BYTES per second
                  (a slow link; 0: full speed)
  clear           no more faults

A fault is set by GET /__fault?reset=2&after=100000 (or status=3&code=503&skip=2,
stall=1&seconds=5, rate=2000000, clear=1); GET /__log returns one line per
request served so far ("GET /path range status"). The proxy prints its port
on stdout once it listens, then serves until killed.

usage: fault_proxy.py UPSTREAM_PORT
"""
import http.client
import http.server
import socket
import struct
import sys
import threading
import time
import urllib.parse

UPSTREAM = int(sys.argv[1])
lock = threading.Lock()
faults = {"reset": 0, "after": 0, "then": 0, "status": 0, "code": 503, "skip": 0, "stall": 0, "seconds": 0.0,
          "rate": 0}
log = []


def take(kind):
    """Consumes one use of fault `kind`; True when it applies to this request."""
    with lock:
        if faults[kind] > 0:
            faults[kind] -= 1
            return True
        return False


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # the test reads /__log instead
        pass

    def control(self, query):
        q = {k: v[0] for k, v in urllib.parse.parse_qs(query).items()}
        with lock:
            if "clear" in q:
                faults.update(reset=0, then=0, status=0, skip=0, stall=0, rate=0)
            for key in ("reset", "after", "then", "status", "code", "skip", "stall", "rate"):
                if key in q:
                    faults[key] = int(q[key])
            if "seconds" in q:
                faults["seconds"] = float(q["seconds"])
        self.reply(200, b"ok\n")

    def reply(self, code, body, headers=()):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        path, _, query = self.path.partition("?")
        if path == "/__fault":
            return self.control(query)
        if path == "/__log":
            with lock:
                text = "".join(line + "\n" for line in log)
            return self.reply(200, text.encode())
        rng = self.headers.get("Range", "-")
        with lock:
            skipping = faults["skip"] > 0
            if skipping and not path.endswith("index.json"):
                faults["skip"] -= 1
        if not skipping and take("status"):
            with lock:
                log.append(f"GET {path} {rng} {faults['code']}")
            return self.reply(faults["code"], b"injected\n")
        up = http.client.HTTPConnection("127.0.0.1", UPSTREAM, timeout=30)
        up.request("GET", self.path, headers={"Range": rng} if rng != "-" else {})
        resp = up.getresponse()
        body = resp.read()
        up.close()
        with lock:
            log.append(f"GET {path} {rng} {resp.status}")
        self.send_response(resp.status)
        for k in ("Content-Type", "Content-Range", "Accept-Ranges", "ETag", "Last-Modified"):
            if resp.getheader(k):
                self.send_header(k, resp.getheader(k))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        is_file = resp.status in (200, 206) and not path.endswith("index.json")
        if is_file and take("reset"):
            self.wfile.write(body[: faults["after"]])
            self.wfile.flush()
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
            with lock:
                if faults["reset"] == 0 and faults["then"]:
                    faults.update(status=10**9, code=faults["then"], then=0)
            return
        if is_file and take("stall"):
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            time.sleep(faults["seconds"])
            self.close_connection = True
            return
        rate = faults["rate"]
        if rate <= 0:
            self.wfile.write(body)
            return
        chunk = max(1, rate // 20)
        for i in range(0, len(body), chunk):
            self.wfile.write(body[i : i + chunk])
            self.wfile.flush()
            time.sleep(chunk / rate)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):  # a client that hung up: expected
            super().handle_error(request, client_address)


def main():
    server = Server(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
