"""The bucket that receives S3 server access logs and VPC flow logs."""

from __future__ import annotations

from aws_cdk import Acknowledgment, Duration, RemovalPolicy, Validations
from aws_cdk import aws_s3 as s3

from constructs import Construct


class AccessLogBucket(Construct):
    """An encrypted, TLS-only, versioned log bucket that expires logs after ``expiry_days``.

    Relies on: S3 server access logging delivers only to SSE-S3 (not SSE-KMS) buckets, so this
    bucket uses S3-managed keys; with ``BucketOwnerEnforced`` ownership the log delivery
    services write through the bucket policy CDK adds, not ACLs. It is always retained:
    deleting the stack never deletes the audit trail.
    """

    def __init__(self, scope: Construct, construct_id: str, *, expiry_days: int) -> None:
        super().__init__(scope, construct_id)
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            minimum_tls_version=1.2,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            versioned=True,
            removal_policy=RemovalPolicy.RETAIN,
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="ExpireLogs",
                    expiration=Duration.days(expiry_days),
                    noncurrent_version_expiration=Duration.days(7),
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                )
            ],
        )
        Validations.of(self.bucket).acknowledge(
            Acknowledgment(
                id="AwsSolutions-S1",
                reason="This is the access-log destination itself; logging it to itself would loop. "
                "It is versioned, TLS-only and private, and CloudTrail records its API calls.",
            )
        )
