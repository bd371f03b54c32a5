"""The buckets that make a replacement node serve in minutes: model weights and Neuron compile cache."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3

from constructs import Construct
from gennstack.config import StorageConfig

_REMOVAL = {"retain": RemovalPolicy.RETAIN, "destroy": RemovalPolicy.DESTROY}


class ModelStorage(Construct):
    """A models bucket and a Neuron compile-cache bucket, encrypted with one customer-managed key.

    Key layout: see ``gennstack.storage_layout`` (``<model-id>/<revision>/`` in the models bucket,
    ``neuron-<sdk>/<model-id>/<revision>/<parallelism>/`` in the compile cache).

    Relies on: S3 Bucket Keys cut KMS requests (and their cost) by orders of magnitude when many
    nodes read hundreds of GB of weights; S3 lifecycle rules act on object age, not last access.
    With ``removal_policy="retain"`` the buckets *and the key* outlive the stack: deleting the key
    would make retained weights unreadable.

    Grant access with :meth:`grant_serving_read` and :meth:`grant_staging_write` rather than
    passing bucket names around.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: StorageConfig,
        access_log_bucket: s3.IBucket,
    ) -> None:
        super().__init__(scope, construct_id)
        removal = _REMOVAL[config.removal_policy]
        self.key = kms.Key(
            self,
            "Key",
            description="GenNStack model weights and Neuron compile cache",
            enable_key_rotation=True,
            removal_policy=removal,
        )
        abort_uploads = Duration.days(config.abort_incomplete_upload_days)

        self.models_bucket = self._bucket(
            "ModelsBucket",
            removal=removal,
            access_log_bucket=access_log_bucket,
            access_log_prefix="models/",
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="AbortIncompleteUploads",
                    abort_incomplete_multipart_upload_after=abort_uploads,
                ),
                s3.LifecycleRule(
                    id="ExpireNoncurrentVersions",
                    noncurrent_version_expiration=Duration.days(config.noncurrent_version_expiry_days),
                ),
            ],
        )
        cache_rules = [
            s3.LifecycleRule(id="AbortIncompleteUploads", abort_incomplete_multipart_upload_after=abort_uploads),
            # An overwritten compile (a re-run of the compile job) stays restorable for a week.
            s3.LifecycleRule(id="ExpireNoncurrentVersions", noncurrent_version_expiration=Duration.days(7)),
        ]
        if config.compile_cache_expiry_days:
            cache_rules.append(
                s3.LifecycleRule(
                    id="ExpireStaleCompileCache", expiration=Duration.days(config.compile_cache_expiry_days)
                )
            )
        self.compile_cache_bucket = self._bucket(
            "CompileCacheBucket",
            removal=removal,
            access_log_bucket=access_log_bucket,
            access_log_prefix="compile-cache/",
            lifecycle_rules=cache_rules,
        )

    def _bucket(
        self,
        construct_id: str,
        *,
        removal: RemovalPolicy,
        access_log_bucket: s3.IBucket,
        access_log_prefix: str,
        lifecycle_rules: list[s3.LifecycleRule],
    ) -> s3.Bucket:
        return s3.Bucket(
            self,
            construct_id,
            encryption=s3.BucketEncryption.KMS,
            encryption_key=self.key,
            bucket_key_enabled=True,
            enforce_ssl=True,
            minimum_tls_version=1.2,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            versioned=True,
            server_access_logs_bucket=access_log_bucket,
            server_access_logs_prefix=access_log_prefix,
            lifecycle_rules=lifecycle_rules,
            removal_policy=removal,
            auto_delete_objects=removal == RemovalPolicy.DESTROY,
        )

    @property
    def buckets(self) -> tuple[s3.Bucket, s3.Bucket]:
        return (self.models_bucket, self.compile_cache_bucket)

    def grant_serving_read(self, grantee: iam.IGrantable) -> None:
        """Read weights and compiled artifacts (and decrypt them). What serving pods get."""
        for bucket in self.buckets:
            bucket.grant_read(grantee)

    def grant_staging_write(self, grantee: iam.IGrantable) -> None:
        """Read and upload (never delete) model weights. What the stage Jobs get: they copy from the
        Hub and run no model code. Versioning keeps an overwritten object restorable."""
        self.models_bucket.grant_read(grantee)
        self.models_bucket.grant_put(grantee)

    def grant_compile_write(self, grantee: iam.IGrantable, *, model_prefix: str, compile_prefix: str) -> None:
        """Read one model revision's weights and read and upload (never delete) one compiled artifact
        set: what one Neuron generation's compile Jobs get, whose pod runs the model's code. Listing
        stays bucket-wide (key names only), so a missing key reads as 404, not 403."""
        self.models_bucket.grant_read(grantee, f"{model_prefix}*")
        self.compile_cache_bucket.grant_read(grantee, f"{compile_prefix}*")
        self.compile_cache_bucket.grant_put(grantee, f"{compile_prefix}*")
