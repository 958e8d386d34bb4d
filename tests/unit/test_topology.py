"""Which GPUs a shard takes, on the fixture machines' topologies as their agents report them."""

from __future__ import annotations

import pytest

from placement.topology import NVLINK, UNKNOWN_LINK, gpus_pick, link_name, pick_words, refusal, topology_of
from tests.fakes.gpu_machines import reported_topology

HGX = topology_of(reported_topology("hgx-h100"))
PAIRS = topology_of(reported_topology("pcie-nvlink-pairs"))
BOX = topology_of(reported_topology("pcie-4gpu"))


def picked(topology, free, count) -> tuple[tuple[int, ...], str | None]:
    gpus = gpus_pick(tuple(free), count, topology)
    return gpus, pick_words(topology, gpus)


def test_the_reported_matrix_reads_as_ranks_and_nodes():
    assert [link_name(PAIRS.link(0, j)) for j in (0, 1, 2, 4)] == ["X", "NV4", "PIX", "SYS"]
    assert link_name(PAIRS.link(4, 6)) == "NODE" and PAIRS.link(0, 0) == NVLINK
    assert PAIRS.numa == (0, 0, 0, 0, 1, 1, 1, 1)
    assert PAIRS.link(0, 8) == UNKNOWN_LINK and PAIRS.numa_of(8) is None
    # -1 says nothing of where a GPU is (a VM, a BIOS that tells the kernel none): unknown, as unread.
    assert BOX.numa == (None, None, None, None) and BOX.numa_minus_one == frozenset(range(4))


@pytest.mark.parametrize(
    ("free", "count", "gpus", "words"),
    [
        # Socket 0 whole: its four cards under one switch, two NVLink pairs.
        (range(8), 4, (0, 1, 2, 3), "GPUs 0-3, one NUMA node"),
        # Two of socket 0 taken: socket 1's four, not two and two across the sockets.
        ((1, 3, 4, 5, 6, 7), 4, (4, 5, 6, 7), "GPUs 4-7, one NUMA node"),
        # An NVLink pair before two cards under one switch, wherever the lowest indices are.
        ((1, 2, 4, 5), 2, (4, 5), "GPUs 4,5, NVLink-complete"),
        ((0, 1, 2, 3), 2, (0, 1), "GPUs 0,1, NVLink-complete"),
        # No set inside a socket: the pairs, across.
        ((0, 1, 4, 6), 4, (0, 1, 4, 6), "GPUs 0,1,4,6, worst link SYS"),
        ((0, 1, 2, 4, 5, 6), 3, (0, 1, 2), "GPUs 0-2, one NUMA node"),
    ],
)
def test_pcie_server_with_nvlink_pairs_over_two_sockets(free, count, gpus, words):
    assert picked(PAIRS, free, count) == (gpus, words)


def test_nvswitch_board_keeps_a_shard_on_the_fewest_numa_nodes():
    assert picked(HGX, range(8), 4) == ((0, 1, 2, 3), "GPUs 0-3, NVLink-complete")
    assert picked(HGX, (2, 3, 4, 5, 6, 7), 4) == ((4, 5, 6, 7), "GPUs 4-7, NVLink-complete")
    assert picked(HGX, (3, 4, 5, 6, 7), 2) == ((4, 5), "GPUs 4,5, NVLink-complete")


def test_pcie_box_without_nvlink_takes_one_switch_tree_and_claims_no_numa_node_it_does_not_know():
    assert picked(BOX, (0, 2, 3), 2) == ((2, 3), "GPUs 2,3, worst link PXB")


def test_unknown_links_take_the_lowest_free_indices_and_say_nothing():
    assert picked(None, (5, 1, 3, 7), 2) == ((1, 3), None)
    unread = topology_of({"links": [["X", None], [None, "X"]], "numa": [None, None]})
    assert picked(unread, (0, 1), 2) == ((0, 1), "GPUs 0,1, links unknown")


def test_one_gpu_is_the_lowest_free_and_needs_no_words():
    assert picked(PAIRS, (6, 2, 7), 1) == ((2,), None)


@pytest.mark.parametrize("document", [{}, None, {"links": "X"}, {"links": [["X", "NV4"]], "numa": [0]}])
def test_a_document_that_is_no_matrix_is_no_topology(document):
    assert topology_of(document) is None


def test_nvlink_all_takes_only_sets_joined_by_nvlink():
    assert gpus_pick(tuple(range(8)), 4, HGX, "nvlink-all") == (0, 1, 2, 3)
    assert gpus_pick(tuple(range(8)), 4, PAIRS, "nvlink-all") is None
    assert gpus_pick((0, 2, 3, 5), 2, PAIRS, "nvlink-all") == (2, 3)
    assert gpus_pick((0, 1), 2, BOX, "nvlink-all") is None
    assert gpus_pick((0, 1), 2, None, "nvlink-all") is None


def test_same_numa_takes_only_sets_on_one_node():
    assert gpus_pick((0, 1, 4, 5, 6, 7), 4, PAIRS, "same-numa") == (4, 5, 6, 7)
    assert gpus_pick((0, 1, 2, 4, 5, 6), 4, PAIRS, "same-numa") is None
    assert gpus_pick((0, 1, 2, 3), 4, BOX, "same-numa") is None  # -1: unknown, never taken for one node
    unread = topology_of({"links": [["X", "PIX"], ["PIX", "X"]], "numa": [0, None]})
    assert gpus_pick((0, 1), 2, unread, "same-numa") is None
    assert gpus_pick((0, 1), 2, unread) == (0, 1)


def test_one_gpu_meets_every_need():
    assert gpus_pick((5, 3), 1, None, "nvlink-all") == (3,)
    assert gpus_pick((5, 3), 1, PAIRS, "same-numa") == (3,)


def test_a_set_joined_by_nvlink_is_found_where_growing_from_each_gpu_misses_it():
    # 3, 4 and 5 are all joined by NVLink; each also has an NVLink to a lower GPU joined to nothing else,
    # which growing from any seed takes first, and then finds no third.
    nv = {(0, 3), (1, 4), (2, 5), (3, 4), (3, 5), (4, 5)}
    links = [["X" if i == j else "NV2" if (min(i, j), max(i, j)) in nv else "SYS" for j in range(6)] for i in range(6)]
    wired = topology_of({"links": links, "numa": [0] * 6})
    assert gpus_pick(tuple(range(6)), 3, wired, "nvlink-all") == (3, 4, 5)
    assert gpus_pick(tuple(range(6)), 4, wired, "nvlink-all") is None


def wired(links: dict[tuple[int, int], str], size: int, numa=None):
    rows = [["X" if i == j else links.get((min(i, j), max(i, j)), "SYS") for j in range(size)] for i in range(size)]
    return topology_of({"links": rows, "numa": numa if numa is not None else [0] * size})


def test_more_nvlinks_rank_before_fewer():
    # Today's any-NVLink-is-the-same would take the lowest pair, (0, 1) on NV1; NV18 is eighteen times that.
    box = wired({(0, 1): "NV1", (2, 3): "NV2", (4, 5): "NV18"}, 6)
    assert picked(box, range(6), 2) == ((4, 5), "GPUs 4,5, NVLink-complete")
    assert picked(box, range(4), 2) == ((2, 3), "GPUs 2,3, NVLink-complete")
    assert gpus_pick(tuple(range(4)), 2, box, "nvlink-all") == (2, 3)


def test_of_two_sets_with_the_same_worst_link_the_one_with_more_nvlinks_in_all_is_taken():
    # Both triples' worst link is NV1; 3-5 has two NV2 links where 0-2 has none.
    box = wired({(0, 1): "NV1", (0, 2): "NV1", (1, 2): "NV1", (3, 4): "NV2", (3, 5): "NV1", (4, 5): "NV2"}, 6)
    assert gpus_pick(tuple(range(6)), 3, box) == (3, 4, 5)


def test_same_numa_refuses_gpus_whose_node_is_minus_one_in_words():
    assert refusal("same-numa", 4, (0, 1, 2, 3), BOX) == (
        "topology: no 4 free GPUs on one NUMA node (free: 0-3; NUMA node unknown for 0-3, reported as -1)"
    )
    unread = topology_of({"links": [["X", "PIX"], ["PIX", "X"]], "numa": [0, None]})
    assert refusal("same-numa", 2, (0, 1), unread) == (
        "topology: no 2 free GPUs on one NUMA node (free: 0,1; NUMA node unknown for 1)"
    )
    assert refusal("same-numa", 4, (0, 1, 4, 6), PAIRS) == "topology: no 4 free GPUs on one NUMA node (free: 0,1,4,6)"


def test_explain_never_claims_one_numa_node_for_minus_one():
    gpus = gpus_pick((0, 1, 2, 3), 4, BOX)
    assert pick_words(BOX, gpus) == "GPUs 0-3, worst link PHB"
