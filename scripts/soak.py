#!/usr/bin/env python3
"""Soak test of tenant isolation on the CPU model: a victim tenant with a TTFT/TBT SLO streams
chats, first alone, then beside three attacker tenants that mix every attack of the hostile
suite (regex bombs and near-limit grammars, schema and tool-parameter bombs, many-message chats
with special-token text, long prompts, constrained floods, stop strings, disconnects at random
moments, oversized /tokenize bodies, slow-header connections from several addresses), admin
quota edits every 10 s, and one SIGTERM and restart of the server in the middle.

Reports, side by side from one run: the victim's TTFT and TBT attainment alone and under
attack; /healthz failures while the server was up; the server's peak RSS; the gauges once
the load stopped (requests running and waiting, KV usage); and each tenant's ledger against
the usage its client received (the attackers' disconnected streams are billed the tokens
generated until the server saw them leave, which their client never counts: reported apart).

Usage: scripts/soak.py --bin target/release/superinfer [--alone-min 10] [--attack-min 10]
                       [--out DIR]
Writes DIR/soak.json (default: soak-out/) and prints it. Standard library only.
"""

import argparse
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ADMIN = "soak-admin-token"
VICTIM_SLO = {"ttft_ms": 500, "tbt_ms": 200}
# The served model's id, read at start.
MODEL = [""]
ATTACKER_QUOTAS = {"requests_per_s": 5.0, "burst": 5, "max_concurrent": 4,
                   "tokens_per_min": 2000}


class Server:
    """`superinfer serve` on the embedded CPU model, restartable on the same port and data."""

    def __init__(self, binary, data_dir):
        self.binary, self.data_dir = binary, data_dir
        self.port = None
        self.proc = None
        self.peak_rss_kb = 0
        self.up = threading.Event()

    def start(self):
        listen = f"127.0.0.1:{self.port or 0}"
        self.proc = subprocess.Popen(
            [self.binary, "serve", "--listen", listen, "--data-dir", self.data_dir,
             "--admin-token", ADMIN, "--drain-timeout-s", "5"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "RUST_LOG": "warn"})
        for line in self.proc.stdout:
            if line.startswith("listening on "):
                self.port = int(line.rsplit(":", 1)[1])
                break
        threading.Thread(target=self._drain, args=(self.proc,), daemon=True).start()
        self.up.set()

    @staticmethod
    def _drain(proc):
        for _ in proc.stdout:
            pass

    def rss_kb(self):
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        kb = int(line.split()[1])
                        self.peak_rss_kb = max(self.peak_rss_kb, kb)
                        return kb
        except OSError:
            return None

    def restart(self):
        self.rss_kb()
        self.up.clear()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        self.start()
        return code

    def stop(self):
        self.rss_kb()
        self.up.clear()
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


def request(port, method, path, body=None, key=None, timeout=120):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn.request(method, path, json.dumps(body) if body is not None else None, headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    try:
        return resp.status, json.loads(data) if data else None
    except ValueError:
        return resp.status, None


class Usage:
    """Usage a client received, summed, and what else it saw."""

    def __init__(self):
        self.lock = threading.Lock()
        self.prompt = self.completion = self.requests = 0
        self.statuses = {}
        self.left = 0

    def add(self, usage):
        with self.lock:
            self.requests += 1
            self.prompt += usage.get("prompt_tokens", 0)
            self.completion += usage.get("completion_tokens", 0)

    def status(self, code):
        with self.lock:
            self.statuses[code] = self.statuses.get(code, 0) + 1


def stream(port, key, body, usage, leave_after=None):
    """A streamed chat completion; returns (ttft_s, gaps) or None when it did not start."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.monotonic()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        resp = conn.getresponse()
    except OSError:
        usage.status("conn")
        return None
    usage.status(resp.status)
    if resp.status != 200:
        resp.read()
        conn.close()
        return None
    first, last, gaps, pieces = None, None, [], 0
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        if event.get("usage"):
            usage.add(event["usage"])
        choices = event.get("choices") or []
        if choices and (choices[0].get("delta") or {}).get("content"):
            now = time.monotonic()
            if first is None:
                first = now
            else:
                gaps.append(now - last)
            last = now
            pieces += 1
            if leave_after is not None and pieces >= leave_after:
                usage.left += 1
                conn.sock.shutdown(socket.SHUT_RDWR)
                conn.close()
                return None
    conn.close()
    return (first - t0 if first else None), gaps


class Victim(threading.Thread):
    """Chats at `rate` per second (Poisson), streamed, each checked against its SLO."""

    def __init__(self, server, key, rate, stop):
        super().__init__(daemon=True)
        self.server, self.key, self.rate, self.stop = server, key, rate, stop
        self.phase = "alone"
        self.results = {"alone": [], "attack": []}
        self.usage = Usage()
        self.lock = threading.Lock()

    def one(self, phase):
        body = {"model": MODEL[0], "max_tokens": 48, "temperature": 0.7,
                "messages": [{"role": "user", "content": "Tell me about the sea."}]}
        r = stream(self.server.port, self.key, body, self.usage)
        with self.lock:
            self.results[phase].append(r)

    def run(self):
        while not self.stop.is_set():
            time.sleep(random.expovariate(self.rate))
            threading.Thread(target=self.one, args=(self.phase,), daemon=True).start()

    def attainment(self, phase):
        ttft_ok = tbt_ok = tbt_n = 0
        rs = self.results[phase]
        for r in rs:
            if r is None or r[0] is None:
                continue
            ttft_ok += r[0] * 1000 <= VICTIM_SLO["ttft_ms"]
            tbt_n += len(r[1])
            tbt_ok += sum(g * 1000 <= VICTIM_SLO["tbt_ms"] for g in r[1])
        return {"requests": len(rs), "ttft": ttft_ok / max(len(rs), 1),
                "tbt": tbt_ok / max(tbt_n, 1)}


def attacks(port, key, usage):
    """One random attack of an attacker tenant."""
    chat = lambda **kw: {"model": MODEL[0], "max_tokens": 16,
                         "messages": [{"role": "user", "content": "Hi"}], **kw}
    kind = random.choice(["regex_bomb", "near_limit_regex", "schema_bomb", "tool_bomb",
                          "many_messages", "long_prompt", "json_flood", "stop_strings",
                          "disconnect", "tokenize_big", "enum_bomb"])
    if kind == "regex_bomb":
        body = chat(guided_regex="a{1000}{1000}")
    elif kind == "near_limit_regex":
        body = chat(guided_regex="(a{100}){100}", max_tokens=8)
    elif kind == "schema_bomb":
        body = chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"s": {"type": "string", "pattern": "(b{300}){300}"}}}}})
    elif kind == "tool_bomb":
        body = chat(tool_choice="required", tools=[{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {
                "x": {"type": "string", "pattern": "a{1000}{1000}"}}}}}])
    elif kind == "enum_bomb":
        body = chat(guided_json={"enum": list(range(5000))})
    elif kind == "many_messages":
        msgs = [{"role": "user", "content": "x<|im_end|>"}]
        msgs += [{"role": "assistant" if i % 2 else "user", "content": ""} for i in range(1, 2048)]
        body = {"model": MODEL[0], "messages": msgs, "max_tokens": 4}
    elif kind == "long_prompt":
        body = {"model": MODEL[0], "max_tokens": 4,
                "messages": [{"role": "user", "content": "word " * 3000}]}
    elif kind == "json_flood":
        body = chat(response_format={"type": "json_object"}, max_tokens=32)
    elif kind == "stop_strings":
        body = chat(stop=[" ", "e", "a", "t"], max_tokens=64)
    elif kind == "tokenize_big":
        status, _ = request(port, "POST", "/tokenize", {"prompt": "x " * 600_000}, key)
        usage.status(status)
        return kind
    else:  # disconnect at a random moment
        stream(port, key, chat(max_tokens=200), usage, leave_after=random.randint(1, 20))
        return kind
    if random.random() < 0.5:
        stream(port, key, body, usage)
    else:
        try:
            status, v = request(port, "POST", "/v1/chat/completions", body, key)
        except OSError:
            usage.status("conn")
            return kind
        usage.status(status)
        if status == 200 and v and v.get("usage"):
            usage.add(v["usage"])
    return kind


def slow_headers(port, stop):
    """Connections by the dozen from a few loopback addresses that never finish their
    headers, renewed every few seconds."""
    while not stop.is_set():
        socks = []
        for i in range(120):
            try:
                s = socket.socket()
                s.bind((f"127.0.0.{2 + i % 6}", 0))
                s.settimeout(1)
                s.connect(("127.0.0.1", port))
                s.send(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
                socks.append(s)
            except OSError:
                pass
        stop.wait(5)
        for s in socks:
            s.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/superinfer")
    ap.add_argument("--alone-min", type=float, default=10)
    ap.add_argument("--attack-min", type=float, default=10)
    ap.add_argument("--victim-rps", type=float, default=2.0)
    ap.add_argument("--out", default="soak-out")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    data = tempfile.mkdtemp(prefix="soak-")
    server = Server(args.bin, data)
    server.start()
    port = lambda: server.port
    keys = {}
    for name in ["victim", "a1", "a2", "a3"]:
        fields = {"name": name}
        fields.update({"slo": VICTIM_SLO} if name == "victim" else {"quotas": ATTACKER_QUOTAS})
        status, v = request(port(), "POST", "/admin/v1/tenants", fields, ADMIN)
        assert status == 201, (status, v)
        keys[name] = v["api_key"]
    status, models = request(port(), "GET", "/v1/models", None, keys["victim"])
    MODEL[0] = models["data"][0]["id"]

    stop_all, stop_attack = threading.Event(), threading.Event()
    health = {"checks": 0, "failures": 0}

    def probe():
        while not stop_all.is_set():
            if server.up.is_set():
                try:
                    status, _ = request(port(), "GET", "/healthz", timeout=2)
                except OSError:
                    status = None
                if server.up.is_set():
                    health["checks"] += 1
                    health["failures"] += status != 200
            server.rss_kb()
            time.sleep(0.25)

    threading.Thread(target=probe, daemon=True).start()
    victim = Victim(server, keys["victim"], args.victim_rps, stop_all)
    victim.start()
    time.sleep(args.alone_min * 60)

    victim.phase = "attack"
    usages = {n: Usage() for n in ["a1", "a2", "a3"]}
    kinds = {}

    def attacker(name):
        while not stop_attack.is_set():
            if not server.up.is_set():
                time.sleep(0.1)
                continue
            try:
                k = attacks(port(), keys[name], usages[name])
                kinds[k] = kinds.get(k, 0) + 1
            except OSError:
                usages[name].status("conn")
            time.sleep(random.uniform(0, 0.2))

    def quota_edits():
        flip = False
        while not stop_attack.wait(10):
            flip = not flip
            for n in usages:
                tpm = 2500 if flip else 2000
                try:
                    request(port(), "PATCH", f"/admin/v1/tenants/{n}",
                            {"quotas": {"tokens_per_min": tpm}}, ADMIN)
                except OSError:
                    pass

    workers = [threading.Thread(target=attacker, args=(n,), daemon=True)
               for n in usages for _ in range(3)]
    workers.append(threading.Thread(target=quota_edits, daemon=True))
    workers.append(threading.Thread(target=slow_headers, args=(port(), stop_attack), daemon=True))
    for w in workers:
        w.start()
    time.sleep(args.attack_min * 30)
    exit_code = server.restart()
    time.sleep(args.attack_min * 30)
    stop_attack.set()
    stop_all.set()
    time.sleep(8)  # streams in flight end

    conn = http.client.HTTPConnection("127.0.0.1", port(), timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    gauges = {}
    for line in text.splitlines():
        for g in ["superinfer_num_requests_running", "superinfer_num_requests_waiting",
                  "superinfer_kv_usage_ratio"]:
            if line.startswith(g):
                gauges[line.rsplit(" ", 1)[0]] = float(line.rsplit(" ", 1)[1])
    status, ledger = request(port(), "GET", "/admin/v1/usage", None, ADMIN)
    billed = {}
    for row in ledger["data"]:
        b = billed.setdefault(row["tenant"], {"requests": 0, "prompt": 0, "completion": 0})
        b["requests"] += row["requests"]
        b["prompt"] += row["prompt_tokens"]
        b["completion"] += row["completion_tokens"]
    final_code = server.stop()
    clients = {"victim": victim.usage, **usages}
    report = {
        "alone_min": args.alone_min, "attack_min": args.attack_min,
        "victim_rps": args.victim_rps, "victim_slo": VICTIM_SLO,
        "victim_alone": victim.attainment("alone"),
        "victim_attacked": victim.attainment("attack"),
        "healthz": health,
        "peak_rss_mb": round(server.peak_rss_kb / 1024, 1),
        "gauges_after": gauges,
        "restart_exit_code": exit_code, "final_exit_code": final_code,
        "attacks": kinds,
        "tenants": {n: {"client_received": {"requests": u.requests, "prompt": u.prompt,
                                             "completion": u.completion},
                        "ledger": billed.get(n), "statuses": {str(k): v for k, v in
                                                              u.statuses.items()},
                        "disconnected_streams": u.left}
                    for n, u in clients.items()},
    }
    with open(os.path.join(args.out, "soak.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    sys.exit(main())
