"""``--upload s3://bucket/prefix`` against moto's S3."""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

from gennstack.bench.upload import parse_s3_uri, upload_directory


@pytest.fixture
def s3(monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="bench-results")
        yield client


def _run_dir(tmp_path):
    run = tmp_path / "20260101T000000Z-mock"
    (run / "llmperf" / "concurrency-8").mkdir(parents=True)
    (run / "result.json").write_text("{}")
    (run / "requests.csv").write_text("a,b\n")
    (run / "report.html").write_text("<html></html>")
    (run / "llmperf" / "concurrency-8" / "mock_512_256_summary.json").write_text("{}")
    return run


def test_uploads_every_file_under_prefix_and_dir_name(s3, tmp_path) -> None:
    run = _run_dir(tmp_path)
    keys = upload_directory(run, "s3://bench-results/gen2/", client=s3)
    listed = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="bench-results")["Contents"])
    assert listed == sorted(keys) == [
        "gen2/20260101T000000Z-mock/llmperf/concurrency-8/mock_512_256_summary.json",
        "gen2/20260101T000000Z-mock/report.html",
        "gen2/20260101T000000Z-mock/requests.csv",
        "gen2/20260101T000000Z-mock/result.json",
    ]
    head = s3.head_object(Bucket="bench-results", Key="gen2/20260101T000000Z-mock/report.html")
    assert head["ContentType"].startswith("text/html")


def test_default_client_and_bucket_root(s3, tmp_path) -> None:
    run = _run_dir(tmp_path)
    keys = upload_directory(run, "s3://bench-results")  # boto3's own client, inside moto
    assert "20260101T000000Z-mock/result.json" in keys


def test_cli_uploads_after_the_run(s3, mock_server, bench_parser, tmp_path) -> None:
    server = mock_server("--ttft", "0.01", "--itl", "0.002")
    out = tmp_path / "run-1"
    args = bench_parser.parse_args(["bench", "--base-url", server.base_url, "--model", "m", "--num-requests", "2",
                                    "--max-tokens", "4", "--output-dir", str(out), "--no-progress",
                                    "--upload", "s3://bench-results/ci"])
    assert args.func(args) == 0
    listed = {o["Key"] for o in s3.list_objects_v2(Bucket="bench-results")["Contents"]}
    assert {"ci/run-1/result.json", "ci/run-1/requests.csv", "ci/run-1/report.html"} <= listed


@pytest.mark.parametrize("uri", ["bench-results/x", "s3://", "https://bucket/x"])
def test_bad_uri(uri) -> None:
    with pytest.raises(ValueError, match="--upload"):
        parse_s3_uri(uri)
