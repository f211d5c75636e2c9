"""A stand-in for the Hugging Face hub: the few routes ``huggingface_hub`` reads to list a model
repo and download its files (repo info, tree, resolve), served from a local folder per repo, on a
thread. Point ``HF_ENDPOINT`` at :attr:`HubStandIn.url`. Requests are logged in ``seen``."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

SHA = "0123456789abcdef0123456789abcdef01234567"


class HubStandIn:
    def __init__(self, repos: dict[str, Path]) -> None:
        self.repos = repos
        self.seen: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._serve(self, body=False)

            def do_GET(self) -> None:
                hub._serve(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _files(self, repo: str) -> list[Path]:
        root = self.repos[repo]
        return sorted(p for p in root.rglob("*") if p.is_file())

    def _serve(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlsplit(h.path).path)
        self.seen.append(f"{h.command} {path}")
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"]:
            repo = "/".join(parts[2:4])
            if repo not in self.repos:
                return self._json(h, {"error": "Repository not found"}, 404, body, missing=True)
            rel = [str(p.relative_to(self.repos[repo])) for p in self._files(repo)]
            if len(parts) > 4 and parts[4] == "tree":
                tree = [
                    {
                        "type": "file",
                        "path": r,
                        "size": (self.repos[repo] / r).stat().st_size,
                        "oid": hashlib.sha1(r.encode()).hexdigest(),
                    }
                    for r in rel
                ]
                return self._json(h, tree, 200, body)
            info = {
                "id": repo,
                "modelId": repo,
                "sha": SHA,
                "private": False,
                "siblings": [{"rfilename": r} for r in rel],
            }
            return self._json(h, info, 200, body)
        if len(parts) >= 5 and parts[2] == "resolve":
            repo, name = "/".join(parts[:2]), "/".join(parts[4:])
            file = self.repos.get(repo, Path("/nonexistent")) / name
            if not file.is_file():
                return self._json(h, {"error": "Entry not found"}, 404, body, missing=True)
            data = file.read_bytes()
            h.send_response(200)
            h.send_header("Content-Length", str(len(data)))
            h.send_header("X-Repo-Commit", SHA)
            h.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            h.send_header("Content-Type", "application/octet-stream")
            h.end_headers()
            if body:
                h.wfile.write(data)
            return None
        return self._json(h, {"error": "not here"}, 404, body)

    @staticmethod
    def _json(h, obj, status: int, body: bool, missing: bool = False) -> None:
        data = json.dumps(obj).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        if missing:
            h.send_header(
                "X-Error-Code", "RepoNotFound" if "Repository" in obj["error"] else "EntryNotFound"
            )
            h.send_header("X-Error-Message", obj["error"])
        h.end_headers()
        if body:
            h.wfile.write(data)
