"""Model storage: encryption, TLS, retention, lifecycle, locked logical IDs, and scoped grants."""

from __future__ import annotations

import pytest
from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from aws_cdk.assertions import Match, Template

from gennstack.storage_layout import compile_cache_prefix, model_prefix
from tests.support import Synth

# Changing these replaces a bucket: CloudFormation would create a new, empty one (and, with the
# retain policy, orphan the old one with every model in it). Change them only on purpose.
LOCKED_LOGICAL_IDS = {
    "ModelStorageModelsBucket2AA7EB86": "AWS::S3::Bucket",
    "ModelStorageCompileCacheBucket619E16CC": "AWS::S3::Bucket",
    "ModelStorageKey0F631CCB": "AWS::KMS::Key",
    "AccessLogsBucketCD784A59": "AWS::S3::Bucket",
}
DATA_BUCKETS = ("ModelStorageModelsBucket2AA7EB86", "ModelStorageCompileCacheBucket619E16CC")


def test_stateful_logical_ids_are_locked(synth: Synth) -> None:
    resources = synth.template["Resources"]
    for logical_id, resource_type in LOCKED_LOGICAL_IDS.items():
        assert logical_id in resources, f"{logical_id} changed: this would replace a stateful resource"
        assert resources[logical_id]["Type"] == resource_type


def test_data_buckets_kms_encrypted_with_bucket_key(synth: Synth) -> None:
    for logical_id in DATA_BUCKETS:
        properties = synth.template["Resources"][logical_id]["Properties"]
        (rule,) = properties["BucketEncryption"]["ServerSideEncryptionConfiguration"]
        assert rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] == "aws:kms"
        assert rule["ServerSideEncryptionByDefault"]["KMSMasterKeyID"] == {"Fn::GetAtt": ["ModelStorageKey0F631CCB", "Arn"]}
        assert rule["BucketKeyEnabled"] is True
    Template.from_json(synth.template).has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})


@pytest.mark.parametrize("logical_id", [*DATA_BUCKETS, "AccessLogsBucketCD784A59"])
def test_buckets_private_versioned_and_tls_only(synth: Synth, logical_id: str) -> None:
    properties = synth.template["Resources"][logical_id]["Properties"]
    assert properties["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert properties["VersioningConfiguration"] == {"Status": "Enabled"}
    assert properties["OwnershipControls"] == {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]}
    policies = [
        p for p in synth.resources("AWS::S3::BucketPolicy").values() if p["Properties"]["Bucket"] == {"Ref": logical_id}
    ]
    (policy,) = policies
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    assert {
        "Action": "s3:*",
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        "Effect": "Deny",
        "Principal": {"AWS": "*"},
        "Resource": Match.any_value(),
    }.keys() <= next(s for s in statements if s.get("Condition", {}).get("Bool")).keys()
    assert any(s.get("Condition", {}).get("NumericLessThan", {}).get("s3:TlsVersion") == 1.2 for s in statements)


def test_data_buckets_log_to_access_log_bucket(synth: Synth) -> None:
    for logical_id, prefix in zip(DATA_BUCKETS, ("models/", "compile-cache/"), strict=True):
        logging = synth.template["Resources"][logical_id]["Properties"]["LoggingConfiguration"]
        assert logging == {"DestinationBucketName": {"Ref": "AccessLogsBucketCD784A59"}, "LogFilePrefix": prefix}


def test_retained_by_default(synth: Synth) -> None:
    for logical_id in [*DATA_BUCKETS, "ModelStorageKey0F631CCB", "AccessLogsBucketCD784A59"]:
        resource = synth.template["Resources"][logical_id]
        assert resource["DeletionPolicy"] == "Retain"
        assert resource["UpdateReplacePolicy"] == "Retain"
    assert synth.resources("Custom::S3AutoDeleteObjects") == {}


def test_destroy_policy_empties_and_deletes_data_but_keeps_logs(synth_variant: Synth) -> None:
    resources = synth_variant.template["Resources"]
    for logical_id in DATA_BUCKETS:
        assert resources[logical_id]["DeletionPolicy"] == "Delete"
    assert len(synth_variant.resources("Custom::S3AutoDeleteObjects")) == 2
    assert resources["AccessLogsBucketCD784A59"]["DeletionPolicy"] == "Retain"


def _rule(synth: Synth, logical_id: str, rule_id: str) -> dict | None:
    rules = synth.template["Resources"][logical_id]["Properties"]["LifecycleConfiguration"]["Rules"]
    return next((r for r in rules if r["Id"] == rule_id), None)


def test_lifecycle_rules(synth: Synth, synth_variant: Synth) -> None:
    models, cache = DATA_BUCKETS
    for logical_id in DATA_BUCKETS:
        assert _rule(synth, logical_id, "AbortIncompleteUploads")["AbortIncompleteMultipartUpload"] == {
            "DaysAfterInitiation": 2
        }
    assert _rule(synth, models, "ExpireNoncurrentVersions")["NoncurrentVersionExpiration"] == {"NoncurrentDays": 30}
    assert _rule(synth, models, "ExpireStaleCompileCache") is None  # model weights never expire
    assert _rule(synth, cache, "ExpireStaleCompileCache")["ExpirationInDays"] == 365
    assert _rule(synth_variant, cache, "ExpireStaleCompileCache") is None  # 0: never expire
    assert _rule(synth, "AccessLogsBucketCD784A59", "ExpireLogs")["ExpirationInDays"] == 365


@pytest.fixture(scope="module")
def grants() -> tuple[set[str], set[str]]:
    """The IAM actions that grant_serving_read and grant_staging_write give, on a fresh stack."""
    from aws_cdk import App

    from gennstack_infra.app import cdk_json_context
    from gennstack_infra.components.access_logs import AccessLogBucket
    from gennstack_infra.components.model_storage import ModelStorage
    from gennstack.config import StorageConfig

    app = App(context=cdk_json_context())  # the feature flags GenNStack runs with
    stack = Stack(app, "GrantTest")
    logs = AccessLogBucket(stack, "Logs", expiry_days=30)
    storage = ModelStorage(stack, "Storage", config=StorageConfig(), access_log_bucket=logs.bucket)
    serving = iam.Role(stack, "Serving", assumed_by=iam.ServicePrincipal("pods.eks.amazonaws.com"))
    staging = iam.Role(stack, "Staging", assumed_by=iam.ServicePrincipal("pods.eks.amazonaws.com"))
    storage.grant_serving_read(serving)
    storage.grant_staging_write(staging)
    template = Template.from_stack(stack).to_json()

    def actions(role_id: str) -> set[str]:
        found: set[str] = set()
        for resource in template["Resources"].values():
            if resource["Type"] == "AWS::IAM::Policy" and resource["Properties"]["Roles"] == [{"Ref": role_id}]:
                for statement in resource["Properties"]["PolicyDocument"]["Statement"]:
                    action = statement["Action"]
                    found.update([action] if isinstance(action, str) else action)
        return found

    role_ids = {k for k, v in template["Resources"].items() if v["Type"] == "AWS::IAM::Role"}
    serving_id = next(r for r in role_ids if r.startswith("Serving"))
    staging_id = next(r for r in role_ids if r.startswith("Staging"))
    return actions(serving_id), actions(staging_id)


def test_serving_can_only_read(grants: tuple[set[str], set[str]]) -> None:
    serving, _ = grants
    assert {"s3:GetObject*", "s3:List*", "kms:Decrypt"} <= serving
    assert not {a for a in serving if a.startswith(("s3:Put", "s3:Delete", "s3:Abort", "kms:Encrypt", "kms:GenerateDataKey"))}


def test_compile_grant_is_scoped_to_one_model_and_one_artifact_set() -> None:
    """grant_compile_write: weights under the model prefix (read), artifacts under the compile prefix
    (read, upload); the bucket-level List stays unscoped so a missing key is a 404, not a 403."""
    from aws_cdk import App

    from gennstack_infra.app import cdk_json_context
    from gennstack_infra.components.access_logs import AccessLogBucket
    from gennstack_infra.components.model_storage import ModelStorage
    from gennstack.config import StorageConfig

    stack = Stack(App(context=cdk_json_context()), "CompileGrantTest")
    logs = AccessLogBucket(stack, "Logs", expiry_days=30)
    storage = ModelStorage(stack, "Storage", config=StorageConfig(), access_log_bucket=logs.bucket)
    role = iam.Role(stack, "Compile", assumed_by=iam.ServicePrincipal("pods.eks.amazonaws.com"))
    storage.grant_compile_write(role, model_prefix="org/m/abc/", compile_prefix="neuron-2.28.0/org/m/abc/tp8/")
    template = Template.from_stack(stack).to_json()
    (policy,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Policy"]
    objects: dict[str, set[str]] = {}
    for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
        for resource in statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]:
            if "Fn::Join" in resource:
                att, suffix = resource["Fn::Join"][1]
                bucket = "models" if att["Fn::GetAtt"][0].startswith("StorageModelsBucket") else "cache"
                objects.setdefault(f"{bucket}{suffix}", set()).update(statement["Action"])
    assert {k: any(a.startswith("s3:Put") for a in v) for k, v in objects.items()} == {
        "models/org/m/abc/*": False, "cache/neuron-2.28.0/org/m/abc/tp8/*": True}


def test_staging_can_upload_but_never_delete(grants: tuple[set[str], set[str]]) -> None:
    _, staging = grants
    assert {"s3:PutObject", "s3:Abort*", "s3:GetObject*", "kms:GenerateDataKey*", "kms:Encrypt"} <= staging
    assert not {a for a in staging if "Delete" in a or a in ("s3:*", "kms:*")}


def test_key_layout() -> None:
    assert model_prefix("openai/gpt-oss-20b", "abc123") == "openai/gpt-oss-20b/abc123/"
    assert (
        compile_cache_prefix(
            neuron_sdk="2.26.0", model_id="meta-llama/Meta-Llama-3-70B-Instruct", revision="abc123", parallelism="tp24"
        )
        == "neuron-2.26.0/meta-llama/Meta-Llama-3-70B-Instruct/abc123/tp24/"
    )


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"model_id": "gpt-oss", "revision": "main"}, "model_id: got 'gpt-oss'"),
        ({"model_id": "a/b", "revision": "../x"}, "revision: got '../x'"),
    ],
)
def test_key_layout_rejects_bad_parts(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment.replace(".", r"\.")):
        model_prefix(**kwargs)


def test_compile_cache_layout_rejects_bad_parallelism() -> None:
    with pytest.raises(ValueError, match="parallelism: got 'tp 24'"):
        compile_cache_prefix(neuron_sdk="2.26.0", model_id="a/b", revision="r", parallelism="tp 24")
