"""Loads a model's safetensors from S3 the way vLLM's ``--load-format runai_streamer`` does, with the
Run:ai model streamer's own code, minus torch (run as a process by test_pod_identity.py).

vLLM lists the weights with ``runai_model_streamer.list_safetensors`` (for s3:// it is
``runai_model_streamer_s3.files.files.glob``, a boto3 client) and streams them with the C++
``libstreamer`` + ``libstreamers3.so`` (its own AWS C++ SDK client and credential chain; the
Python layer hands it credentials only when ``RUNAI_STREAMER_NO_BOTO3_SESSION=0``). The package's
``__init__`` imports torch for the tensor API; this probe loads its submodules without running that
``__init__`` and calls the same functions: ``files.glob``, ``credentials.get_credentials``,
``runai_set_credentials``, ``runai_start``/``runai_request``/``runai_response`` into a host buffer.

    usage: python streamer_probe.py s3://bucket/prefix/
    prints JSON: {"files": {url: {"sha256": ..., "tensors": [...]}}, "credentials_from": "boto3" | "c++"}
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import json
import os
import struct
import sys
import types


def _load_without_package_init() -> None:
    # Register the package with its path but without executing its __init__ (which imports torch).
    spec = importlib.util.find_spec("runai_model_streamer")
    package = types.ModuleType("runai_model_streamer")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["runai_model_streamer"] = package


def main(prefix: str) -> None:
    _load_without_package_init()
    from runai_model_streamer.libstreamer import libstreamer as lib
    from runai_model_streamer_s3.credentials.credentials import get_credentials
    from runai_model_streamer_s3.files.files import glob

    if os.environ.get("PROBE_SKIP_GLOB") == "1":  # only the C++ client talks to S3
        urls = None
    else:
        urls = glob(prefix, ["*.safetensors"])  # what list_safetensors() does for s3:// paths
    session, credentials = get_credentials(None)
    streamer = lib.runai_start()
    buffers = []
    out: dict = {"credentials_from": "boto3" if session is not None else "c++", "files": {}}
    try:
        if credentials is not None and any(
            v is not None for v in (credentials.access_key_id, credentials.session_token, credentials.region_name)
        ):
            lib.runai_set_credentials(streamer, credentials)
        s3 = _sizes(prefix, urls)
        urls = sorted(s3) if urls is None else urls
        for url in urls:
            size = s3[url]
            buffer = ctypes.create_string_buffer(size)
            buffers.append(buffer)
            lib.runai_request(streamer, [url], [1], [0], [size], [ctypes.addressof(buffer)])
            response = lib.runai_response(streamer, 30_000)
            if response is None or response[0] != lib.SUCCESS_ERROR_CODE:
                code = response[0] if response else "finished"
                raise SystemExit(f"streaming {url} failed: {lib.runai_response_str(code) if response else code}")
            data = buffer.raw
            (header_len,) = struct.unpack("<Q", data[:8])
            header = json.loads(data[8 : 8 + header_len])
            out["files"][url] = {"sha256": hashlib.sha256(data).hexdigest(),
                                 "tensors": sorted(k for k in header if k != "__metadata__")}
    finally:
        lib.runai_end(streamer)
    print(json.dumps(out))


def _sizes(prefix: str, urls: list[str] | None) -> dict[str, int]:
    """Object sizes, from the streamer's C++ listing (runai_list_files), so that listing is exercised too."""
    from runai_model_streamer.libstreamer import libstreamer as lib

    sizes: dict[str, int] = {}
    streamer = lib.runai_start()
    try:
        lib.runai_list_files(streamer, prefix, lambda path, size: sizes.__setitem__(path, size), is_recursive=False)
    finally:
        lib.runai_end(streamer)
    missing = [u for u in urls or [] if u not in sizes]
    if missing:
        raise SystemExit(f"C++ listing of {prefix} did not return {missing} (got {sorted(sizes)})")
    return sizes


if __name__ == "__main__":
    main(sys.argv[1])
