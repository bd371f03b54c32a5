"""The serving chart as the stack installs it: Pod Identity roles, the token secret, values and order."""

from __future__ import annotations

import json

from tests.support import Synth

RELAY_DOCKERFILE = "assets/images/resume-relay/Dockerfile"  # the gateway's relay image, built from the repo root


def _role_actions(synth: Synth, role_prefix: str) -> set[str]:
    (role_id,) = [k for k in synth.resources("AWS::IAM::Role") if k.startswith(role_prefix)]
    actions: set[str] = set()
    for policy in synth.resources("AWS::IAM::Policy").values():
        if {"Ref": role_id} in policy["Properties"]["Roles"]:
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
                action = statement["Action"]
                actions.update([action] if isinstance(action, str) else action)
    return actions


def test_serving_role_can_only_read(synth: Synth) -> None:
    actions = _role_actions(synth, "ServingServingRole")
    assert {"s3:GetObject*", "s3:List*", "kms:Decrypt"} <= actions
    assert not {a for a in actions if a.startswith(("s3:Put", "s3:Delete", "s3:Abort", "secretsmanager:", "kms:Encrypt"))}


def test_staging_role_uploads_and_reads_the_token_but_never_deletes(synth: Synth) -> None:
    actions = _role_actions(synth, "ServingStagingRole")
    assert {"s3:PutObject", "s3:GetObject*", "kms:GenerateDataKey*", "secretsmanager:GetSecretValue"} <= actions
    assert not {a for a in actions if "Delete" in a or a in ("s3:*", "kms:*", "secretsmanager:*")}
    # The stage Jobs copy weights; the compile cache is the compile roles' (below).
    assert "ModelStorageCompileCacheBucket" not in json.dumps(_role_statements(synth, "ServingStagingRole"))


def _role_statements(synth: Synth, role_prefix: str) -> list[dict]:
    (role_id,) = [k for k in synth.resources("AWS::IAM::Role") if k.startswith(role_prefix)]
    return [statement for policy in synth.resources("AWS::IAM::Policy").values() if {"Ref": role_id} in policy["Properties"]["Roles"]
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]]


def _arn_suffixes(resource) -> list[tuple[str, str]]:
    """(bucket logical id, key pattern) of each resource: the bucket ARN alone gives ""."""
    out = []
    for r in resource if isinstance(resource, list) else [resource]:
        if "Fn::GetAtt" in r:
            out.append((r["Fn::GetAtt"][0], ""))
        else:
            att, suffix = r["Fn::Join"][1]
            out.append((att["Fn::GetAtt"][0], suffix))
    return out


def test_compile_roles_write_only_their_generations_artifacts(synth: Synth) -> None:
    """A compile Job's pod runs the model's code, so its role (one per Neuron generation) may read that
    generation's model and upload only to its compile-cache prefix: never another model's keys, never
    the models bucket, never the Hugging Face token (issue 35). The prefixes are gennstack.serving's,
    which a chart test holds the compile Jobs to."""
    from gennstack.config import load_config
    from gennstack.serving import compile_cache_prefixes, model_prefixes

    config = load_config({})
    models, compiled = model_prefixes(config), compile_cache_prefixes(config, config.serving)
    assert set(compiled) == {"inf2", "trn2", "g6e"}  # g6e: vLLM's compile cache
    for name in compiled:
        statements = _role_statements(synth, f"ServingCompile{name.capitalize()}Role")
        actions = {a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
        assert "s3:PutObject" in actions and not [a for a in actions if a.startswith("secretsmanager:") or "Delete" in a]
        for statement in statements:
            if not any(str(a).startswith("s3:") for a in statement["Action"]):
                continue
            for bucket, suffix in _arn_suffixes(statement["Resource"]):
                writes = any(a.startswith(("s3:Put", "s3:Abort")) for a in statement["Action"])
                if writes:
                    assert (bucket.startswith("ModelStorageCompileCacheBucket"), suffix) == (True, f"/{compiled[name]}*")
                elif suffix:  # object reads: this generation's model and compiled artifacts only
                    assert suffix in (f"/{models[name]}*", f"/{compiled[name]}*"), (name, bucket, suffix)


def test_roles_bound_to_the_charts_service_accounts_by_pod_identity(synth: Synth) -> None:
    associations = {
        a["Properties"]["ServiceAccount"]: a["Properties"]
        for a in synth.resources("AWS::EKS::PodIdentityAssociation").values()
        if a["Properties"]["Namespace"] == "gennstack-serving"
    }
    assert set(associations) == {"gennstack-serving", "gennstack-staging", "gennstack-compile-inf2", "gennstack-compile-trn2",
                                 "gennstack-compile-g6e"}
    assert associations["gennstack-serving"]["RoleArn"]["Fn::GetAtt"][0].startswith("ServingServingRole")
    assert associations["gennstack-staging"]["RoleArn"]["Fn::GetAtt"][0].startswith("ServingStagingRole")
    assert associations["gennstack-compile-inf2"]["RoleArn"]["Fn::GetAtt"][0].startswith("ServingCompileInf2Role")
    assert associations["gennstack-compile-trn2"]["RoleArn"]["Fn::GetAtt"][0].startswith("ServingCompileTrn2Role")
    assert associations["gennstack-compile-g6e"]["RoleArn"]["Fn::GetAtt"][0].startswith("ServingCompileG6eRole")
    for prefix in ("ServingServingRole", "ServingStagingRole", "ServingCompileInf2Role", "ServingCompileTrn2Role"):
        (role,) = [r for k, r in synth.resources("AWS::IAM::Role").items() if k.startswith(prefix)]
        trust = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        assert {s["Principal"]["Service"] for s in trust} == {"pods.eks.amazonaws.com"}
        assert {a for s in trust for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])} == {
            "sts:AssumeRole", "sts:TagSession"
        }


def _chart(synth: Synth) -> dict:
    (chart,) = [
        c["Properties"] for c in synth.resources("Custom::AWSCDK-EKS-HelmChart").values()
        if c["Properties"].get("Release") == "gennstack-serving"
    ]
    return chart


def test_chart_is_the_repos_asset_in_the_serving_namespace(synth: Synth) -> None:
    chart = _chart(synth)
    assert chart["Namespace"] == "gennstack-serving"
    assert "ChartAssetURL" in chart and "Repository" not in chart


def test_values_carry_names_and_arns_never_the_token(synth: Synth) -> None:
    text = json.dumps(_chart(synth)["Values"])
    ((secret_id, secret),) = [
        (k, v) for k, v in synth.resources("AWS::SecretsManager::Secret").items() if k.startswith("ServingHuggingFaceToken")
    ]
    assert secret_id in text  # the secret's ARN (a Ref) goes in, so the Job knows what to read
    assert "SecretString" not in secret["Properties"]  # generated placeholder; the token is put in by hand
    assert "hf_" not in text
    for bucket in ("ModelStorageModelsBucket2AA7EB86", "ModelStorageCompileCacheBucket619E16CC"):
        assert bucket in text
    assert secret["DeletionPolicy"] == "Retain"


def test_chart_installs_after_operators_node_pools_and_associations(synth: Synth) -> None:
    resources = synth.template["Resources"]
    (chart_id,) = [
        k for k, c in resources.items()
        if c["Type"] == "Custom::AWSCDK-EKS-HelmChart" and c["Properties"].get("Release") == "gennstack-serving"
    ]
    depends = set(resources[chart_id]["DependsOn"])
    assert any(d.startswith("OperatorsKubeRayOperator") for d in depends)
    # ScaledObjects need KEDA's CRDs, which its chart installs.
    assert any(d.startswith("OperatorsKeda") for d in depends)
    assert any(d.startswith("NodePools") for d in depends)
    assert {d for d in depends if d.startswith("Serving") and "Association" in d} == {
        k for k in resources if k.startswith(("ServingServingAssociation", "ServingStagingAssociation", "ServingCompileInf2Association",
                                              "ServingCompileTrn2Association", "ServingCompileG6eAssociation"))
    }
    rbac = [k for k in resources if k.startswith("InterruptionHandlerRbac")]
    assert rbac and chart_id in resources[rbac[0]]["DependsOn"]


def test_inf2_ray_image_is_built_from_the_pinned_dlc_plus_ray(synth: Synth) -> None:
    """KubeRay runs `ray start` in every gen1-inf2 pod; the Neuron vLLM DLC has no Ray."""
    import re

    import yaml

    from tests.support import ROOT

    dockerfile = (ROOT / "assets" / "images" / "inf2-ray-serve" / "Dockerfile").read_text()
    values = yaml.safe_load((ROOT / "assets" / "charts" / "gennstack-serving" / "values.yaml").read_text())
    (base,) = re.findall(r"^FROM (\S+)$", dockerfile, flags=re.MULTILINE)
    assert base == values["images"]["neuronVllm"], "the inf2 image must build on the chart's Neuron image"
    assert re.search(r'"ray\[serve\]==\d+\.\d+\.\d+"', dockerfile), "pin Ray Serve"
    assets = json.loads((synth.outdir / "GenNStack.assets.json").read_text())
    # besides the stream-resume relay's image (the gateway's: assets/images/resume-relay)
    (image,) = [i for i in assets["dockerImages"].values() if i["source"].get("dockerFile") != RELAY_DOCKERFILE]
    assert image["source"]["platform"] == "linux/amd64"
    assert "container-assets" in json.dumps(_chart(synth)["Values"])  # the chart runs the built image


def test_a_configured_inf2_image_is_used_as_is(synth_variant: Synth) -> None:
    assets = json.loads((synth_variant.outdir / "GenNStack.assets.json").read_text())
    assert [i["source"].get("dockerFile") for i in assets.get("dockerImages", {}).values()] == [RELAY_DOCKERFILE]
    assert "inf2-ray-serve:1" in json.dumps(_chart(synth_variant)["Values"])
