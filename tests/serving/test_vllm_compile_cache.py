"""gen3-g6e's vLLM compile cache: its S3 key, the compile Job that writes it and the servers that restore it.

vLLM 0.29.0 (the g6e image, gennstack.serving.support; read in the `pip download vllm==0.29.0` wheel):
- vllm/envs.py: ``VLLM_CACHE_ROOT`` (default ``~/.cache/vllm``), read by every cache path below;
  ``compile_factors()`` hashes every known vLLM env var into the torch.compile cache key except an
  ignore list that holds ``VLLM_CACHE_ROOT``; ``use_aot_compile()`` is on by default with torch >= 2.10
  (the wheel requires torch==2.13.0).
- vllm/compilation/backends.py: the cache dir is ``<VLLM_CACHE_ROOT>/torch_compile_cache/<hash>``, the
  hash over env factors, ``vllm_config.compute_hash()`` (ModelConfig.compute_hash keeps ``model``,
  ``model_weights`` and ``revision``), the traced code and the compiler's hash; decorators.py puts AOT
  artifacts under ``torch_compile_cache/torch_aot_compile/<hash>`` with inductor_cache inside.
- vllm/compilation/compiler_interface.py InductorAdaptor.initialize_cache sets TRITON_CACHE_DIR to a
  folder under the cache dir itself; the chart sets TRITON_CACHE_DIR under VLLM_CACHE_ROOT for the rest.
- vllm/transformers_utils/runai_utils.py ObjectStorageModel: an s3:// model's local dir is
  ``<VLLM_ASSETS_CACHE>/model_streamer/<sha256(url)[:8]>``, and config/model.py sets ``model`` to it
  (``model_weights`` to the URL): so the compile Job must load the same s3:// URL the servers do.
"""

from __future__ import annotations

import pytest

from gennstack.config import load_config
from gennstack.serving import ServingConfig, compile_cache_prefixes
from gennstack.storage_layout import vllm_compile_cache_prefix
from tests import helm
from tests.serving.conftest import CHART, NAMESPACE, REQUIRED, STAGING, cdk_values, merged, only


def _key(**overrides: str) -> str:
    parts = {"vllm": "0.29.0", "model_id": "openai/gpt-oss-20b", "revision": "abc", "gpu": "l40s",
             "parallelism": "tp1-seqs64-len32768", **overrides}
    return vllm_compile_cache_prefix(**parts)


def test_the_key_names_vllm_model_revision_gpu_and_layout() -> None:
    assert _key() == "vllm-0.29.0/openai/gpt-oss-20b/abc/l40s-tp1-seqs64-len32768/"
    others = [_key(vllm="0.30.0"), _key(revision="def"), _key(gpu="h100"), _key(parallelism="tp4-seqs64-len32768"),
              _key(parallelism="tp1-seqs32-len32768"), _key(parallelism="tp1-seqs64-len8192"),
              _key(model_id="openai/gpt-oss-120b")]
    assert len({_key(), *others}) == len(others) + 1
    # No key is a prefix of another's: a listing of one never reads another's objects.
    assert not [a for a in others if a != _key() and a.startswith(_key())]


@pytest.mark.parametrize("bad, named", [({"vllm": "0.29/0"}, "vllm"), ({"gpu": ""}, "gpu"),
                                        ({"parallelism": "tp 1"}, "parallelism"), ({"revision": "a/b"}, "revision")])
def test_a_bad_part_is_named(bad: dict, named: str) -> None:
    with pytest.raises(ValueError, match=f"^{named}: got"):
        _key(**bad)


def test_python_and_the_chart_build_the_same_key_from_the_config() -> None:
    for serving in ({}, {"g6e": {"gpus_per_replica": 4, "max_num_seqs": 32, "max_model_len": 8192}}):
        config = ServingConfig.model_validate(serving)
        expected = compile_cache_prefixes(load_config({}), config)["g6e"]
        assert expected.startswith("vllm-0.29.0/openai/gpt-oss-20b/")
        objects = helm.render(CHART, merged(cdk_values(serving=config), STAGING), namespace=NAMESPACE)
        (job,) = [o for o in objects if o["kind"] == "Job" and o["metadata"]["name"].startswith("gen3-g6e-compile-")]
        assert job["metadata"]["annotations"]["gennstack.io/s3-prefix"].endswith(f"/{expected}")
        (server,) = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "gen3-g6e"]
        sync = server["spec"]["template"]["spec"]["initContainers"][0]
        assert {e["name"]: e.get("value") for e in sync["env"]}["COMPILE_PREFIX"] == expected


def _env(container: dict) -> dict:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_the_compile_job_runs_the_servers_exact_vllm_and_uploads_what_the_servers_restore() -> None:
    """vLLM's cache key covers its arguments and every vLLM env var: the compile container must match
    the server on both, and write where the servers' sync restores (VLLM_CACHE_ROOT, in the home volume)."""
    objects = helm.render(CHART, merged(REQUIRED, STAGING, only("g6e")), namespace=NAMESPACE)
    (job,) = [o for o in objects if o["kind"] == "Job" and o["metadata"]["name"].startswith("gen3-g6e-compile-")]
    (server,) = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "gen3-g6e"]
    pod, served = job["spec"]["template"]["spec"], server["spec"]["template"]["spec"]
    compile_c = next(c for c in pod["initContainers"] if c["name"] == "compile")
    vllm_c = next(c for c in served["containers"] if c["name"] == "vllm")
    relevant = lambda env: {k: v for k, v in env.items() if k.startswith(("VLLM_", "TRITON_")) or k in ("HOME", "USER")}
    assert relevant(_env(compile_c)) == relevant(_env(vllm_c))
    assert _env(vllm_c)["VLLM_CACHE_ROOT"] == "/home/vllm/.cache/vllm"
    assert _env(vllm_c)["TRITON_CACHE_DIR"].startswith(_env(vllm_c)["VLLM_CACHE_ROOT"] + "/")
    assert '"--model","s3://' in _env(vllm_c)["VLLM_ARGS"]  # the same s3:// URL both load, hashed by vLLM
    assert compile_c["securityContext"]["runAsUser"] == vllm_c["securityContext"]["runAsUser"] == 2000
    upload = next(c for c in pod["containers"] if c["name"] == "upload")
    assert _env(upload)["COMPILED_DIR"] == _env(vllm_c)["VLLM_CACHE_ROOT"]
    assert {"name": "home", "mountPath": "/home/vllm", "readOnly": True} in upload["volumeMounts"]
    assert {"name": "home", "mountPath": "/home/vllm"} in compile_c["volumeMounts"]
    assert pod["serviceAccountName"] == "gennstack-compile-g6e"
    assert job["spec"]["suspend"] is True  # released by its stage Job once the model is in S3
    sync = served["initContainers"][0]
    assert sync["name"] == "sync-from-s3" and _env(sync)["COMPILE_OPTIONAL"] == "true"
    assert _env(sync)["COMPILED_DIR"] == _env(vllm_c)["VLLM_CACHE_ROOT"]
    assert {"name": "home", "mountPath": "/home/vllm"} in sync["volumeMounts"]
    # The server's account stays read-only: only the compile Job's account is another.
    assert served["serviceAccountName"] == "gennstack-serving"


def test_neuron_servers_still_require_their_compiled_model() -> None:
    objects = helm.render(CHART, merged(REQUIRED, only("trn2")), namespace=NAMESPACE)
    (server,) = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "gen2-trn2"]
    assert "COMPILE_OPTIONAL" not in _env(server["spec"]["template"]["spec"]["initContainers"][0])
