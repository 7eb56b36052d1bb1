"""Run Anthropic's Claude Code CLI against `kiln serve` (its Messages API, runtime/messages_api.py): the check that
what Claude Code sends today is still served, with the request body it sent written down for tests.

    python tools/claude_code_check.py                        # a tiny random Llama with a 128k context
    python tools/claude_code_check.py --model ARTIFACT_OR_MODEL --prompt "Say hi"

Installs @anthropic-ai/claude-code with npm into ~/.cache/kiln/claude-code (once), serves the model on a free
loopback port, runs `claude -p PROMPT --model NAME` with ANTHROPIC_BASE_URL pointing at it (HOME in a scratch
folder: no login, no settings), and prints Claude Code's output, the server's answer lines and the top-level
fields of each request it sent (a capturing proxy in front of the server records them to --dump). The tiny model
answers random text; what is checked is that the request gets a 200 and a stream Claude Code reads. Claude Code's
prompt is ~69k tokens of the tiny 512-token vocabulary (23,961 of SmolLM2's): a model needs that much context.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

CACHE = Path.home() / ".cache" / "kiln" / "claude-code"


def claude_binary() -> Path:
    """The claude CLI, installed with npm into CACHE where it is not there yet."""
    binary = CACHE / "node_modules" / ".bin" / "claude"
    if not binary.exists():
        if shutil.which("npm") is None:
            sys.exit("error: npm is needed to install Claude Code (apt-get install npm)")
        CACHE.mkdir(parents=True, exist_ok=True)
        print(f"installing @anthropic-ai/claude-code into {CACHE} ...", flush=True)
        subprocess.run(["npm", "install", "--prefix", str(CACHE), "@anthropic-ai/claude-code"], check=True)
        install = CACHE / "node_modules" / "@anthropic-ai" / "claude-code" / "install.cjs"
        if install.exists():                    # npm may skip the postinstall that places the native binary
            subprocess.run(["node", str(install)], check=True, cwd=install.parent)
    return binary


def tiny_model(folder: Path) -> Path:
    """A tiny random Llama with a 131072-token context, compiled for this CPU."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import kiln
    from tiny_models import write_tiny_llama
    write_tiny_llama(folder / "hf", tied=True, max_position_embeddings=131072)
    return Path(kiln.compile(str(folder / "hf"), target="cpu", quant="q0f32", output=folder / "art"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def capturing_proxy(port: int, upstream: str, dump: Path) -> http.server.ThreadingHTTPServer:
    """A loopback proxy that appends each POST's path and JSON body to `dump`, then passes it on."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            with dump.open("a") as f:
                f.write(json.dumps({"path": self.path, "body": json.loads(body or b"null")}) + "\n")
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
            request = urllib.request.Request(upstream + self.path, data=body, headers=headers, method="POST")
            try:
                reply = urllib.request.urlopen(request, timeout=600)
            except urllib.error.HTTPError as e:
                reply = e
            self.send_response(reply.status)
            for k, v in reply.headers.items():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            self.send_header("connection", "close")
            self.end_headers()
            while chunk := reply.read(4096):
                self.wfile.write(chunk)
                self.wfile.flush()

        def do_HEAD(self) -> None:
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="what `kiln serve` takes (default: a tiny random Llama with a 128k context)")
    ap.add_argument("--prompt", default="hello")
    ap.add_argument("--dump", type=Path, default=Path("/tmp/claude_code_requests.jsonl"),
                    help="where the requests' bodies are written (one JSON line each)")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="kiln-claude-"))
    model = args.model or str(tiny_model(scratch))
    claude = claude_binary()
    port, proxy_port = free_port(), free_port()
    server = subprocess.Popen([sys.executable, "-m", "kiln.cli", "serve", model, "--port", str(port),
                               "--model-name", "kiln-model"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                if server.poll() is not None:
                    sys.exit(f"error: kiln serve exited:\n{server.stdout.read()}")
                time.sleep(1)
        args.dump.unlink(missing_ok=True)
        proxy = capturing_proxy(proxy_port, f"http://127.0.0.1:{port}", args.dump)
        env = dict(os.environ, HOME=str(scratch / "home"), ANTHROPIC_BASE_URL=f"http://127.0.0.1:{proxy_port}",
                   ANTHROPIC_API_KEY="unused")
        started = time.monotonic()
        run = subprocess.run([str(claude), "-p", args.prompt, "--model", "kiln-model"], env=env, text=True,
                             capture_output=True, timeout=900)
        print(f"claude exited {run.returncode} after {time.monotonic() - started:.1f} s; its output:")
        print((run.stdout + run.stderr)[-2000:])
        proxy.shutdown()
        for line in args.dump.read_text().splitlines() if args.dump.exists() else []:
            request = json.loads(line)
            body = request["body"] or {}
            print(request["path"], {k: v if k not in ("system", "messages", "tools") else f"<{len(json.dumps(v))}"
                                    " chars>" for k, v in body.items()})
    finally:
        server.terminate()
        out, _ = server.communicate(timeout=30)
        print("server:", *[line for line in out.splitlines() if "/v1/" in line], sep="\n  ")


if __name__ == "__main__":
    main()
