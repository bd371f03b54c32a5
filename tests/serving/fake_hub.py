"""A Hugging Face Hub on 127.0.0.1 that answers what huggingface_hub's ``HfApi.model_info(...,
files_metadata=True)`` and ``hf_hub_download`` ask (the API routes of huggingface_hub 1.28.0's
hf_api.py and file_download.py), and a plain file server for the tiktoken encodings.

Files whose name ends in ``.safetensors`` are served as LFS files (``lfs.sha256``), the rest as
git blobs (``blobId`` = git's sha1). ``corrupt`` names files whose bytes differ from the digest
the API announces (a truncated or tampered download). Every request needs the bearer token.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    def __init__(self, repo: str, files: dict[str, bytes], *, commit: str, refs: dict[str, str], token: str,
                 corrupt: frozenset[str] = frozenset(), static: dict[str, bytes] | None = None) -> None:
        self.repo, self.files, self.commit, self.refs, self.token = repo, files, commit, refs, token
        self.corrupt, self.static = corrupt, static or {}
        self.downloads: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_HEAD(self) -> None:  # noqa: N802
                self.do_GET()

            def do_GET(self) -> None:  # noqa: N802
                path = unquote(urlparse(self.path).path)
                if path.startswith("/encodings/") and path[len("/encodings/"):] in hub.static:
                    return self._send(200, hub.static[path[len("/encodings/"):]])
                if self.headers.get("Authorization") != f"Bearer {hub.token}":
                    return self._send(401, b'{"error": "Invalid credentials"}', {"X-Error-Code": "RepoNotFound"})
                api = re.fullmatch(rf"/api/models/{re.escape(hub.repo)}/revision/([^/]+)", path)
                if api:
                    sha = hub.resolve(api.group(1))
                    if sha is None:
                        return self._send(404, b'{"error": "Invalid rev id"}', {"X-Error-Code": "RevisionNotFound"})
                    return self._send(200, json.dumps(hub.model_info(sha)).encode(), {"Content-Type": "application/json"})
                resolve = re.fullmatch(rf"/{re.escape(hub.repo)}/resolve/([^/]+)/(.+)", path)
                if resolve and hub.resolve(resolve.group(1)) and resolve.group(2) in hub.files:
                    name = resolve.group(2)
                    data = hub.files[name]
                    etag = hashlib.sha256(data).hexdigest() if name.endswith(".safetensors") else git_blob_sha1(data)
                    body = data[:-1] + b"!" if name in hub.corrupt else data
                    if self.command == "GET":
                        hub.downloads.append(name)
                    return self._send(200, body, {"X-Repo-Commit": hub.resolve(resolve.group(1)), "ETag": f'"{etag}"',
                                                  "Content-Type": "application/octet-stream"})
                self._send(404, b'{"error": "not found"}', {"X-Error-Code": "EntryNotFound"})

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def resolve(self, rev: str) -> str | None:
        return self.commit if rev == self.commit else self.refs.get(rev)

    def model_info(self, sha: str) -> dict:
        siblings = []
        for name, data in self.files.items():
            sibling: dict = {"rfilename": name, "size": len(data)}
            if name.endswith(".safetensors"):
                sibling["lfs"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "pointerSize": 134}
                sibling["blobId"] = git_blob_sha1(b"lfs pointer of " + name.encode())
            else:
                sibling["blobId"] = git_blob_sha1(data)
            siblings.append(sibling)
        return {"id": self.repo, "modelId": self.repo, "sha": sha, "private": False, "siblings": siblings}

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
