"""The bundled price table: its schema, its dates and sources, staleness, and every error it raises."""

from __future__ import annotations

import json
from datetime import date

import pytest

from gennstack.cost.prices import BUNDLED, SERVICE_KEYS, STALE_AFTER_DAYS, PriceError, load_table, parse_table
from gennstack.instances import INSTANCE_TYPES

DATA = json.loads(BUNDLED.read_text(encoding="utf-8"))


def test_every_price_names_a_dated_source_and_services_say_whether_confirmed() -> None:
    for name, source in DATA["sources"].items():
        assert source["title"] and source["url"] and date.fromisoformat(source["date"]), name
    for region, table in DATA["regions"].items():
        assert set(table["services"]) == set(SERVICE_KEYS), region
        for key, entry in table["services"].items():
            assert isinstance(entry["confirmed"], bool), f"{region} {key} must say whether it was confirmed"
        for instance_type, entry in table["ec2_on_demand_per_hour"].items():
            assert entry["source"] in DATA["sources"], instance_type
    assert 0 < DATA["spot_estimate"]["discount"] <= 0.9 and "assumption" in DATA["spot_estimate"]["basis"]


def test_bundled_ec2_prices_are_karpenters_us_east_1_table_of_2026_07_06() -> None:
    """Karpenter v1.14.1 pkg/providers/pricing/zz_generated.pricing_aws.go ("generated at 2026-07-06T14:20:29Z for
    us-east-1"), InitialOnDemandPricesAWS["us-east-1"], the figures copied here; it lists no trn2.48xlarge."""
    table = load_table("us-east-1")
    assert {t: p.usd for t, p in table.on_demand.items()} == {
        "g6e.xlarge": 1.861, "g6e.2xlarge": 2.24208, "g6e.4xlarge": 3.00424, "g6e.8xlarge": 4.52856,
        "g6e.12xlarge": 10.49264, "g6e.16xlarge": 7.57719, "g6e.24xlarge": 15.06559, "g6e.48xlarge": 30.13118,
        "inf2.24xlarge": 6.49063, "inf2.48xlarge": 12.98127,
        "m7i.large": 0.1008, "m6i.large": 0.096, "m7a.large": 0.11592, "m7i.xlarge": 0.2016,
    }
    assert {p.as_of for p in table.on_demand.values()} == {date(2026, 7, 6)}
    # every accelerator type GenNStack knows is priced, except trn2 (not sold on demand in us-east-1)
    assert sorted(t for t in INSTANCE_TYPES if t not in table.on_demand) == ["trn2.48xlarge"]


def test_staleness_is_computed_against_the_injected_day() -> None:
    price = load_table("us-east-1").on_demand_price("g6e.xlarge")
    assert price.age_days(date(2026, 11, 30)) == 147 and price.stale(date(2026, 11, 30))
    assert not price.stale(date(2026, 7, 6).fromordinal(date(2026, 7, 6).toordinal() + STALE_AFTER_DAYS))


def test_spot_is_an_estimate_offline() -> None:
    spot = load_table("us-east-1").spot_price("inf2.48xlarge")
    assert spot.kind == "estimate" and spot.usd == pytest.approx(12.98127 * 0.4)


def _broken(path: list[str], value) -> dict:
    data = json.loads(json.dumps(DATA))
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


@pytest.mark.parametrize(("path", "value", "message"), [
    (["schema"], "x/1", "price file: not a GenNStack price table (expected schema 'gennstack-prices/1')"),
    (["sources", "readme-2026", "date"], "yesterday",
     "sources.readme-2026.date: got 'yesterday'; allowed: an ISO date such as 2026-07-06"),
    (["regions", "us-east-1", "ec2_on_demand_per_hour", "g6e.xlarge", "price"], -1,
     "regions.us-east-1.ec2_on_demand_per_hour.g6e.xlarge.price: got -1; allowed: a positive number of US dollars"),
    (["regions", "us-east-1", "ec2_on_demand_per_hour", "g6e.xlarge", "source"], "a blog",
     "regions.us-east-1.ec2_on_demand_per_hour.g6e.xlarge.source: got 'a blog'; allowed: one of the file's sources"),
    (["regions", "us-east-1", "services", "nlb_per_hour"], KeyError,
     "regions.us-east-1.services: missing ['nlb_per_hour'], unknown []"),
    (["spot_estimate", "discount"], 0.95, "--spot-discount: got 0.95; allowed: 0 to 0.9"),
])
def test_a_malformed_table_names_the_key_and_what_is_allowed(path, value, message) -> None:
    with pytest.raises(PriceError) as exc:
        parse_table(_broken(path, value), "us-east-1")
    assert str(exc.value).startswith(message)


def test_a_region_without_prices_is_a_clear_error() -> None:
    with pytest.raises(PriceError) as exc:
        load_table("eu-west-1")
    assert str(exc.value) == ("region: got 'eu-west-1'; allowed: a region the bundled price table has (['us-east-1']); "
                              "for eu-west-1 run `gennstack cost --live` (AWS Price List API)")


def test_an_unknown_instance_type_and_capacity_type_are_clear_errors() -> None:
    table = load_table("us-east-1")
    with pytest.raises(PriceError, match=r"instance type 'p5.48xlarge': no on-demand price for region us-east-1 in the bundled "
                                         r"table .*give one with --price p5.48xlarge=USD_PER_HOUR"):
        table.on_demand_price("p5.48xlarge")
    with pytest.raises(PriceError, match="capacity type: got 'dedicated'; allowed: 'spot', 'on-demand' or 'reserved'"):
        table.price("g6e.xlarge", "dedicated")
