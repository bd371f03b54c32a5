"""Which zones a deploy uses, which of them EKS and the instance types can use, and a better set.

Zone *names* (us-east-1a) map to zone *IDs* (use1-az1) differently in each account; offerings and
EKS's restrictions are by ID, config is by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Zone IDs whose subnets an EKS cluster cannot use (its control-plane network interfaces):
# awsdocs/amazon-eks-user-guide, latest/ug/networking/network-reqs.adoc ("The subnets can't reside
# in the following Availability Zones"), commit 101184ecc138f7f661b484f2cabac7022b726a6b.
EKS_DISALLOWED_ZONE_IDS: dict[str, frozenset[str]] = {
    "us-east-1": frozenset({"use1-az3"}),
    "us-west-1": frozenset({"usw1-az2"}),
    "ca-central-1": frozenset({"cac1-az3"}),
}


@dataclass(frozen=True)
class Zone:
    name: str
    zone_id: str


def eks_supported(region: str, zone: Zone) -> bool:
    return zone.zone_id not in EKS_DISALLOWED_ZONE_IDS.get(region, frozenset())


def region_zones(availability_zones: Iterable[Mapping[str, object]]) -> list[Zone]:
    """The region's usable Availability Zones (no Local or Wavelength Zones), by name.

    ``availability_zones``: ``DescribeAvailabilityZones``' ``AvailabilityZones``.
    """
    zones = [
        Zone(str(z["ZoneName"]), str(z["ZoneId"]))
        for z in availability_zones
        if z.get("ZoneType", "availability-zone") == "availability-zone" and z.get("State") == "available"
    ]
    return sorted(zones, key=lambda zone: zone.name)


def get_azs(zones: list[Zone], default_subnet_zone_names: set[str]) -> list[Zone]:
    """What ``Fn::GetAZs`` returns: zones in name order, only those with a default subnet unless none has one.

    AWS CloudFormation Template Reference, "Fn::GetAZs": "returns an array that lists Availability
    Zones for a specified Region in alphabetical order" and "returns only Availability Zones that
    have a default subnet unless none of the Availability Zones has a default subnet; in that
    case, all Availability Zones are returned."
    """
    with_default = [zone for zone in zones if zone.name in default_subnet_zone_names]
    return with_default or list(zones)


def offered_in(offerings: Mapping[str, set[str]], instance_types: Iterable[str], zone: Zone) -> list[str]:
    """The ``instance_types`` offered in ``zone`` (``offerings``: instance type -> zone IDs)."""
    return [t for t in instance_types if zone.zone_id in offerings.get(t, set())]


def suggest_zones(
    region: str, zones: list[Zone], groups: Mapping[str, tuple[str, ...]], offerings: Mapping[str, set[str]], count: int
) -> tuple[list[Zone], list[str]]:
    """``count`` EKS-supported zones that offer the most groups (generations, system types).

    Returns the zones (in name order) and the groups that some suggested zone still lacks. Greedy:
    each pick is the zone that adds the most groups no pick offers yet, then the one offering the
    most groups, then the first by name; so a group offered in a single zone still gets that zone,
    and the answer is deterministic.
    """
    remaining = [zone for zone in zones if eks_supported(region, zone)]
    offered = {zone: {name for name, types in groups.items() if offered_in(offerings, types, zone)} for zone in remaining}
    chosen: list[Zone] = []
    uncovered = set(groups)
    while remaining and len(chosen) < count:
        best = min(remaining, key=lambda zone: (-len(offered[zone] & uncovered), -len(offered[zone]), zone.name))
        chosen.append(best)
        remaining.remove(best)
        uncovered -= offered[best]
    chosen.sort(key=lambda zone: zone.name)
    lacking = [name for name, types in groups.items() if any(not offered_in(offerings, types, z) for z in chosen)]
    return chosen, lacking


def config_line(zones: list[Zone]) -> str:
    return "network.availability_zones: [" + ", ".join(zone.name for zone in zones) + "]"


def describe(zones: Iterable[Zone]) -> str:
    return ", ".join(f"{zone.name} ({zone.zone_id})" for zone in zones)
