"""`gennstack cost --live` against botocore-Stubber clients (no AWS): Price List and spot-history responses
shaped like the botocore 1.44.8 service models (tests/events/cost), the command's output and its errors."""

from __future__ import annotations

import argparse
import io
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from gennstack.cost import live
from gennstack.cost.cli import run_hourly
from tests.support import ROOT

EVENTS = ROOT / "tests" / "events" / "cost"
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
TYPES = ["g6e.12xlarge", "g6e.xlarge", "inf2.48xlarge", "m7i.large", "m7i.xlarge"]
FLEET_GENERATIONS = {"inf2": ("inf2.48xlarge",), "g6e": ("g6e.xlarge", "g6e.12xlarge")}
CONFIG = {"region": "us-east-1", "generations": {"trn2": {"enabled": False}, "g6e": {"instance_types": ["g6e.xlarge", "g6e.12xlarge"]}}}


@pytest.fixture(autouse=True)
def fake_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def event(name: str) -> dict[str, Any]:
    data = json.loads((EVENTS / f"{name}.json").read_text(encoding="utf-8"))
    for row in data.get("SpotPriceHistory", []):
        row["Timestamp"] = datetime.fromisoformat(row["Timestamp"])
    return data


class Stubs:
    def __init__(self, region: str = "us-east-1") -> None:
        self.pricing = boto3.client("pricing", region_name="us-east-1")
        self.ec2 = boto3.client("ec2", region_name=region)
        self.cloudwatch = boto3.client("cloudwatch", region_name=region)
        self.stubbers = {"pricing": Stubber(self.pricing), "ec2": Stubber(self.ec2), "cloudwatch": Stubber(self.cloudwatch)}
        for stubber in self.stubbers.values():
            stubber.activate()

    def factory(self, service: str) -> Any:
        return {"pricing": self.pricing, "ec2": self.ec2, "cloudwatch": self.cloudwatch}[service]

    def products(self, region: str = "us-east-1", empty: tuple[str, ...] = ()) -> None:
        for instance_type in TYPES:
            name = "empty" if instance_type in empty else instance_type
            self.stubbers["pricing"].add_response("get_products", event(f"pricing.get_products.{name}"), {
                "ServiceCode": "AmazonEC2", "Filters": live.on_demand_filters(instance_type, region),
                "FormatVersion": "aws_v1", "MaxResults": 100})

    def spot(self, zones: list[str] | None = None) -> None:
        params: dict[str, Any] = {"InstanceTypes": TYPES, "ProductDescriptions": ["Linux/UNIX"], "StartTime": NOW}
        if zones:
            params["Filters"] = [{"Name": "availability-zone", "Values": zones}]
        self.stubbers["ec2"].add_response("describe_spot_price_history", event("ec2.describe_spot_price_history.us-east-1"), params)

    def fleet(self, nodes: dict[str, float] | None = None, generations: dict[str, tuple[str, ...]] | None = None) -> None:
        """The handler's AcceleratorNodes as GetMetricData answers: ``{"<generation>|<capacity>|<type>": nodes}``
        (newest first); every other series has no datapoint in the window."""
        generations = generations or FLEET_GENERATIONS
        queries = live.fleet_queries(generations, namespace="GenNStack", service="interruption-handler")
        results = []
        for query in queries:
            value = (nodes or {}).get(query["Label"])
            results.append({"Id": query["Id"], "Label": query["Label"], "StatusCode": "Complete",
                            "Timestamps": [NOW - timedelta(minutes=2), NOW - timedelta(minutes=3)] if value is not None else [],
                            "Values": [value, 99.0] if value is not None else []})
        self.stubbers["cloudwatch"].add_response("get_metric_data", {"MetricDataResults": results, "Messages": []}, {
            "MetricDataQueries": queries, "ScanBy": "TimestampDescending",
            "StartTime": NOW - timedelta(minutes=10), "EndTime": NOW})

    def done(self) -> None:
        for stubber in self.stubbers.values():
            stubber.assert_no_pending_responses()


def args(tmp_path: Path, config: dict, **extra: Any) -> argparse.Namespace:
    from gennstack_infra.app import cdk_json_context

    context = cdk_json_context()
    context["gennstack"] = {**context["gennstack"], **config}
    cdk_json = tmp_path / "cdk.json"
    cdk_json.write_text(json.dumps({"context": context}))
    base = {"cdk_json": str(cdk_json), "config": None, "region": None, "live": True, "profile": None, "markdown": False,
            "json": False, "spot_discount": None, "price": []}
    return argparse.Namespace(**{**base, **extra})


def run(ns: argparse.Namespace, stubs: Stubs) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run_hourly(ns, make_clients=lambda _region: stubs.factory, now=NOW, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_live_prices_replace_the_bundled_ones_and_spot_is_observed_per_zone(tmp_path: Path) -> None:
    stubs = Stubs()
    stubs.products()
    stubs.spot()
    stubs.fleet()
    code, out, err = run(args(tmp_path, CONFIG), stubs)
    stubs.done()
    assert code == 0, err
    assert "spot (observed, cheapest zone)" in out
    # Karpenter v1.14.1's spot launches are price-capacity-optimized (pkg/providers/instance/types.go):
    # not every node lands in the cheapest zone, so that price is a lower bound, and said to be.
    assert any("spot: every node is priced at its type's cheapest zone (a lower bound)" in line for line in out.splitlines())
    # the fixture has no spot pool for g6e.12xlarge: said, and only its figure is the estimate
    assert ("no spot price for g6e.12xlarge in us-east-1: its spot figure is the estimate (on-demand less the stated "
            "discount)") in out.splitlines()
    # inf2 at its cheapest zone's newest price (us-east-1c 3.8938), not the older 9.999 of the same pool
    assert "1 x inf2.48xlarge (1 replica(s), 1 per node)" in out and "$3.89" in out
    assert "spot prices by zone (live, cheapest first):" in out
    assert ("  inf2.48xlarge: us-east-1c $3.8938 (70% off), us-east-1a $4.1207 (68% off), us-east-1d $5.0021 (61% off); "
            "cheapest us-east-1c") in out.splitlines()
    assert "prices as of 2026-11-01, 2026-11-30; the oldest is 29 days old" in out  # Price List effective date


def test_live_json_and_configured_zones(tmp_path: Path) -> None:
    stubs = Stubs()
    stubs.products()
    stubs.spot(["us-east-1a", "us-east-1c", "us-east-1d"])
    stubs.fleet()
    config = {**CONFIG, "network": {"availability_zones": ["us-east-1a", "us-east-1c", "us-east-1d"]}}
    code, out, _ = run(args(tmp_path, config, json=True), stubs)
    stubs.done()
    data = json.loads(out)
    assert code == 0 and data["spot_basis"] == "observed"
    assert data["spot_by_zone"]["g6e.xlarge"] == {"us-east-1a": 0.7423, "us-east-1c": 0.6881, "us-east-1d": 0.9154}
    assert data["groups"]["g6e"]["items"][0]["spot_usd_per_hour"] == pytest.approx(2 * 0.6881)
    assert data["groups"]["g6e"]["items"][0]["on_demand_usd_per_hour"] == pytest.approx(2 * 1.861)


def test_a_type_not_sold_on_demand_is_noted(tmp_path: Path) -> None:
    stubs = Stubs()
    stubs.products(empty=("g6e.12xlarge",))
    stubs.spot()
    stubs.fleet()
    code, out, _ = run(args(tmp_path, CONFIG), stubs)
    assert code == 0 and "no on-demand price in us-east-1 for g6e.12xlarge (not sold on demand there)" in out


def test_a_region_the_price_list_does_not_sell_in_is_an_error(tmp_path: Path) -> None:
    stubs = Stubs("ap-southeast-7")
    stubs.products("ap-southeast-7", empty=tuple(TYPES))
    code, _, err = run(args(tmp_path, {**CONFIG, "region": "ap-southeast-7"}), stubs)
    assert code == 2
    assert err.strip() == ("gennstack cost: region: got 'ap-southeast-7'; the AWS Price List has no on-demand Linux price "
                           f"there for any of {TYPES}")


def test_access_denied_names_the_action(tmp_path: Path) -> None:
    stubs = Stubs()
    stubs.stubbers["pricing"].add_client_error("get_products", service_error_code="AccessDeniedException",
                                               service_message="not authorized", http_status_code=400)
    code, _, err = run(args(tmp_path, CONFIG), stubs)
    assert code == 2
    assert err.strip() == ("gennstack cost: --live: access denied to pricing:GetProducts (AccessDeniedException) while reading "
                           "the on-demand price of g6e.12xlarge in us-east-1; allow pricing:GetProducts (read-only) or run "
                           "without --live for the bundled prices")


def test_throttled_spot_history_says_so(tmp_path: Path) -> None:
    stubs = Stubs()
    stubs.products()
    stubs.stubbers["ec2"].add_client_error("describe_spot_price_history", service_error_code="RequestLimitExceeded",
                                           service_message="slow down", http_status_code=503)
    code, _, err = run(args(tmp_path, CONFIG), stubs)
    assert code == 2 and "throttled by ec2:DescribeSpotPriceHistory (RequestLimitExceeded)" in err


def test_parse_on_demand_reads_the_hourly_rate() -> None:
    item = event("pricing.get_products.g6e.12xlarge")["PriceList"][0]
    usd, effective = live.parse_on_demand(item)
    assert usd == 10.49264 and effective.isoformat() == "2026-11-01"


def test_live_in_a_region_the_bundled_table_lacks_keeps_us_east_1_service_prices_and_says_so(tmp_path: Path) -> None:
    types = ["g6e.xlarge", "m7i.large", "m7i.xlarge"]
    stubs = Stubs("us-east-2")
    for instance_type in types:
        stubs.stubbers["pricing"].add_response("get_products", event(f"pricing.get_products.{instance_type}.us-east-2"), {
            "ServiceCode": "AmazonEC2", "Filters": live.on_demand_filters(instance_type, "us-east-2"),
            "FormatVersion": "aws_v1", "MaxResults": 100})
    stubs.stubbers["ec2"].add_response("describe_spot_price_history", event("ec2.describe_spot_price_history.us-east-2"),
                                       {"InstanceTypes": types, "ProductDescriptions": ["Linux/UNIX"], "StartTime": NOW})
    stubs.fleet(generations={"g6e": ("g6e.xlarge",)})
    config = {"region": "us-east-2", "generations": {"inf2": {"enabled": False}, "trn2": {"enabled": False},
                                                     "g6e": {"instance_types": ["g6e.xlarge"]}}}
    code, out, err = run(args(tmp_path, config), stubs)
    stubs.done()
    assert code == 0, err
    assert out.splitlines()[0] == "GenNStack cost per hour in us-east-2: what runs all the time"
    assert ("service prices (EKS, NAT, endpoints, NLB, EBS) are the bundled us-east-1 ones: the bundled table has none "
            "for us-east-2 and --live refreshes only EC2") in out.splitlines()
    assert "  g6e.xlarge: us-east-2a $0.6512 (65% off), us-east-2b $0.7034 (62% off); cheapest us-east-2a" in out.splitlines()


def test_on_demand_filters_are_karpenters() -> None:
    """Karpenter v1.14.1 pkg/providers/pricing/pricing.go: fetchOnDemandPricing filters (all TERM_MATCH) regionCode,
    serviceCode AmazonEC2, preInstalledSw NA, operatingSystem Linux, capacitystatus Used, marketoption OnDemand, and
    UpdateOnDemandPricing adds tenancy Shared and productFamily "Compute Instance" for non-metal instances. GenNStack
    asks one type at a time, so it adds instanceType."""
    assert live.on_demand_filters("g6e.xlarge", "us-east-2") == [
        {"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in (
            ("instanceType", "g6e.xlarge"), ("regionCode", "us-east-2"), ("serviceCode", "AmazonEC2"), ("preInstalledSw", "NA"),
            ("operatingSystem", "Linux"), ("capacitystatus", "Used"), ("marketoption", "OnDemand"), ("tenancy", "Shared"),
            ("productFamily", "Compute Instance"))]


def test_zero_price_dimensions_are_skipped_like_karpenters() -> None:
    """Karpenter v1.14.1 onDemandPage skips a dimension whose price is 0 or unparsable."""
    product = json.loads(event("pricing.get_products.g6e.xlarge")["PriceList"][0])
    for term in product["terms"]["OnDemand"].values():
        for dim in term["priceDimensions"].values():
            dim["pricePerUnit"]["USD"] = "0.0000000000"
    assert live.parse_on_demand(json.dumps(product)) is None


def test_live_shows_what_the_on_demand_share_costs_now(tmp_path: Path) -> None:
    """The reconciler's AcceleratorNodes (lambdas/interruption_handler/spot_return.py node_census) priced live:
    one inf2.48xlarge left on on-demand costs its on-demand price, and that less its spot price more than spot."""
    stubs = Stubs()
    stubs.products()
    stubs.spot()
    stubs.fleet({"inf2|on-demand|inf2.48xlarge": 1, "g6e|spot|g6e.xlarge": 2, "g6e|on-demand|g6e.xlarge": 0})
    code, out, err = run(args(tmp_path, CONFIG, json=True), stubs)
    stubs.done()
    assert code == 0, err
    share = json.loads(out)["on_demand_now"]
    assert share["nodes_by_capacity_type"] == {"on-demand": 1, "spot": 2, "reserved": 0}
    [row] = share["on_demand"]
    on_demand = json.loads(out)["groups"]["inf2"]["items"][0]["on_demand_usd_per_hour"]
    assert (row["generation"], row["instance_type"], row["nodes"]) == ("inf2", "inf2.48xlarge", 1)
    assert row["on_demand_usd_per_hour"] == pytest.approx(on_demand)
    assert row["premium_usd_per_hour"] == pytest.approx(on_demand - 3.8938)  # the cheapest zone's spot, as above
    assert share["as_of"] == (NOW - timedelta(minutes=2)).isoformat()


def test_the_share_text_and_a_denied_read_is_a_note(tmp_path: Path) -> None:
    stubs = Stubs()
    stubs.products()
    stubs.spot()
    stubs.fleet({"inf2|on-demand|inf2.48xlarge": 1})
    code, out, _ = run(args(tmp_path, CONFIG), stubs)
    assert code == 0
    assert any(line.startswith("  inf2: 1 x inf2.48xlarge on-demand $") and "more than at spot ($3.89/h)" in line
               for line in out.splitlines()), out
    denied = Stubs()
    denied.products()
    denied.spot()
    denied.stubbers["cloudwatch"].add_client_error("get_metric_data", service_error_code="AccessDenied",
                                                   service_message="no", http_status_code=403)
    code, out, _ = run(args(tmp_path, CONFIG), denied)
    assert code == 0 and "on-demand share now not shown: --live: access denied to cloudwatch:GetMetricData" in out


def test_fleet_queries_name_the_handlers_dimensions() -> None:
    """Powertools v3 adds the service name as dimension "service" to each single_metric, next to the
    handler's own (generation, capacity_type, instance_type): a query without it finds nothing."""
    [query] = live.fleet_queries({"inf2": ("inf2.48xlarge",)}, namespace="GenNStack", service="interruption-handler")[:1]
    assert query["MetricStat"]["Metric"] == {"Namespace": "GenNStack", "MetricName": "AcceleratorNodes", "Dimensions": [
        {"Name": "capacity_type", "Value": "on-demand"}, {"Name": "generation", "Value": "inf2"},
        {"Name": "instance_type", "Value": "inf2.48xlarge"}, {"Name": "service", "Value": "interruption-handler"}]}
