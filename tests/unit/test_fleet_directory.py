"""How a fleet server reads its directory and tells where an id lives (verl_sf/server/fleet.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl_sf.server.fleet import FleetMember, FleetRouting
from verl_sf.server.relay import front_of

A, B = "0a0a0a0a0a0a", "0b0b0b0b0b0b"


def routing(tmp_path: Path, servers: dict[str, str] | None, node: str = A) -> FleetRouting:
    directory = tmp_path / "servers.json"
    if servers is not None:
        directory.write_text(json.dumps({"servers": servers}))
    return FleetRouting(FleetMember(node, directory, boot="beef"))


def test_a_node_tag_is_hex() -> None:
    with pytest.raises(ValueError, match="lowercase hex"):
        FleetMember("../etc", Path("x"))
    assert FleetMember(A, Path("x"), boot="beef").id_prefix == f"n{A}-beef-"


def test_without_a_directory_listing_it_a_server_answers_alone(tmp_path: Path) -> None:
    assert routing(tmp_path, None).peers() is None
    assert routing(tmp_path, {B: "http://b"}).peers() is None
    (tmp_path / "servers.json").write_text("{not json")
    assert FleetRouting(FleetMember(A, tmp_path / "servers.json")).peers() is None


def test_ids_name_their_server_and_creations_go_round(tmp_path: Path) -> None:
    peers = routing(tmp_path, {B: "http://b:2", A: "http://a:1"}).peers()
    assert peers is not None
    assert list(peers.urls) == ["http://a:1", "http://b:2"] and peers.own == 0
    assert peers.owner(f"n{B}-0001-i123") == 1 and peers.owner(f"n{A}-beef-f1-i123") == 0
    assert peers.owner("f1-i123") is None and peers.owner("n0c0c0c0c0c0c-0001-i1") is None
    assert [list(peers.placement()) for _ in range(3)] == [[0, 1], [1, 0], [0, 1]]


def test_a_directory_rewritten_is_read_again(tmp_path: Path) -> None:
    fleet = routing(tmp_path, {A: "http://a:1"})
    assert fleet.peers() is not None and len(fleet.peers().urls) == 1  # type: ignore[union-attr]
    (tmp_path / "servers.json").write_text(json.dumps({"servers": {A: "http://a:1", B: "http://b:22"}}))
    assert list(fleet.peers().urls) == ["http://a:1", "http://b:22"]  # type: ignore[union-attr]


def test_gone_ids_are_an_older_boot_of_this_server_or_a_server_no_longer_listed(tmp_path: Path) -> None:
    fleet = routing(tmp_path, {A: "http://a:1", B: "http://b:2"})
    assert not fleet.gone(f"n{A}-beef-i1") and fleet.gone(f"n{A}-0001-i1")
    assert not fleet.gone(f"n{B}-0001-i1") and fleet.gone("n0c0c0c0c0c0c-0001-i1")
    assert not fleet.gone("i1") and not fleet.gone("f1-i1")


def test_a_front_is_found_after_the_fleet_part_of_an_id() -> None:
    assert front_of(f"n{A}-beef-f1-i123", 2) == 1 and front_of("f0-i1", 2) == 0
    assert front_of(f"n{A}-beef-f2-i123", 2) is None and front_of(f"n{A}-beef-i123", 2) is None
