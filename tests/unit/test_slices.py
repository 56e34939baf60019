"""GPU shares of MIG slices and shards (`bridge.slurm.slices`), on literal inputs.

Where the literals come from:
- Slurm's GRES guide, https://slurm.schedmd.com/gres.html, "MIG Management": the example
  configuration for a node with one whole A100 and two MIG slices of the profile slurmd
  reports as `nvidia_a100_3g.20gb`; and "Sharding": `Gres=gpu:2,shard:64` with
  `AccountingStorageTRES=gres/gpu,gres/shard`.
- Slurm's own test of --tres-per-task (testsuite/python/tests, `tres_dict`) asserts
  `gres/shard=3` in a job's AllocTRES for `--tres-per-task=gres/shard:3`.
- A recorded `sacct --format alloctres` line of a plain typed-GPU job
  (PrincetonUniversity/jobstats issue #6).
The docs record no AllocTRES line of a job on a MIG slice; the job lines below are the
guide's configuration put through Slurm's counting (`_set_type_tres_cnt`,
src/stepmgr/gres_stepmgr.c: the untyped `gres/gpu` sums every GPU GRES, slices included;
`gres/gpu:<type>` is that exact type's count).
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from bridge.slurm.parse import gpus_from_tres, gpus_from_tres_list, parse_gres
from bridge.slurm.slices import (
    MigProfile,
    SliceError,
    SliceRules,
    gpu_share_from_tres,
    gpu_share_from_tres_list,
    is_mig_type,
    parent_gpu_type,
    parse_mig_profile,
    shard_share,
    shares_from_tres,
    slice_share,
)

# gres.html, MIG Management (recorded in the guide)
DOC_MIG_ACCOUNTING = "AccountingStorageTRES=gres/gpu,gres/gpu:a100,gres/gpu:a100_3g.20gb"
DOC_MIG_NODE_GRES = "gpu:a100:1,gpu:a100_3g.20gb:2"
DOC_MIG_PROFILE = "nvidia_a100_3g.20gb"
# gres.html, Sharding (recorded in the guide)
DOC_SHARD_NODE_GRES = "gpu:2,shard:64"
# Slurm's testsuite: what --tres-per-task=gres/shard:3 must put in AllocTRES
SLURM_TEST_SHARD_ALLOC = "gres/shard=3"
# jobstats issue #6: a recorded AllocTRES of a 4-GPU job
RECORDED_PLAIN_ALLOC = "billing=112,cpu=36,gres/gpu:rtx2080ti=4,gres/gpu=4,mem=180G,node=1"

# the guide's node: one job on one of its 3g.20gb slices, and the whole node allocated
ONE_SLICE = "cpu=1,gres/gpu=1,gres/gpu:a100_3g.20gb=1,node=1"
WHOLE_NODE = "gres/gpu=3,gres/gpu:a100=1,gres/gpu:a100_3g.20gb=2"

COMPUTE = SliceRules()
MEMORY = SliceRules(share="memory", gpu_memory_gb={"a100": 40})  # the guide's A100: 7g.40gb


# --- profile names --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "gpu", "compute", "memory", "ext"),
    [
        ("1g.10gb", None, 1, 10, ()),
        ("3g.40gb", None, 3, 40, ()),
        ("7g.80gb", None, 7, 80, ()),
        ("1g.10gb+me", None, 1, 10, ("+me",)),
        ("a100_3g.20gb", "a100", 3, 20, ()),
        (DOC_MIG_PROFILE, "nvidia_a100", 3, 20, ()),
        ("H100_1G.10GB", "H100", 1, 10, ()),
    ],
)
def test_profile_names(
    name: str, gpu: str | None, compute: int, memory: int, ext: tuple[str, ...]
) -> None:
    assert parse_mig_profile(name) == MigProfile(name, gpu, compute, memory, ext)
    assert is_mig_type(name)


@pytest.mark.parametrize(
    "name", ["", "a100", "1g10gb", "1g.gb", "g.10gb", "1g.10mb", "1g.10gb+", "0g.10gb", "1g.0gb"]
)
def test_bad_profile_names(name: str) -> None:
    with pytest.raises(SliceError, match="MIG profile"):
        parse_mig_profile(name)


def test_whole_gpu_types_are_not_slices() -> None:
    for name in ("a100", "h100", "rtx2080ti", "a100-sxm4-80gb", "nvidia_gb10"):
        assert not is_mig_type(name)
    assert parent_gpu_type("a100_3g.20gb") == "a100"
    assert parent_gpu_type("3g.20gb") is None
    assert parent_gpu_type("h100") == "h100"
    assert parent_gpu_type(None) is None


# --- fractions ------------------------------------------------------------------------


def test_one_slice_of_an_80gb_gpu_by_compute_and_by_memory() -> None:
    one = parse_mig_profile("1g.10gb")
    assert slice_share(one, SliceRules(), gpu_type="h100") == Fraction(1, 7)
    by_memory = SliceRules(share="memory", gpu_memory_gb={"h100": 80})
    assert slice_share(one, by_memory, gpu_type="h100") == Fraction(10, 80)
    whole = parse_mig_profile("7g.80gb")
    assert slice_share(whole, SliceRules()) == 1
    assert slice_share(whole, by_memory, gpu_type="h100") == 1
    # media extensions do not change the share
    assert slice_share(parse_mig_profile("1g.10gb+me"), SliceRules()) == Fraction(1, 7)


def test_compute_slices_per_gpu_type() -> None:
    rules = SliceRules(compute_slices_of={"a30": 4})
    assert slice_share(parse_mig_profile("a30_1g.6gb"), rules) == Fraction(1, 4)
    assert slice_share(parse_mig_profile("1g.6gb"), rules, gpu_type="a30") == Fraction(1, 4)
    with pytest.raises(SliceError, match="8 compute slices of a GPU that has 7"):
        slice_share(parse_mig_profile("8g.80gb"), SliceRules())


def test_memory_share_needs_the_gpu_memory() -> None:
    rules = SliceRules(share="memory")
    with pytest.raises(SliceError, match="gpu_memory_gb for 'a100'"):
        slice_share(parse_mig_profile("a100_3g.20gb"), rules)
    small = SliceRules(share="memory", gpu_memory_gb={"a100": 10})
    with pytest.raises(SliceError, match="20 GB of a GPU of 10 GB"):
        slice_share(parse_mig_profile("a100_3g.20gb"), small)


def test_rules_are_validated_and_frozen() -> None:
    with pytest.raises(SliceError, match="slice share"):
        SliceRules(share="sm")  # type: ignore[arg-type]
    with pytest.raises(SliceError, match="at least 1"):
        SliceRules(compute_slices=0)
    with pytest.raises(SliceError, match="shards per GPU of 'n1'"):
        SliceRules(shards_per_gpu={"n1": 0})
    table = {"a100": 40}
    rules = SliceRules(share="memory", gpu_memory_gb=table)
    table["a100"] = 80  # the caller's dict is copied
    assert rules.gpu_memory_gb["a100"] == 40
    with pytest.raises(TypeError):
        rules.gpu_memory_gb["a100"] = 80  # type: ignore[index]


# --- the guide's MIG node: no GPU counted twice -----------------------------------------


def test_doc_mig_node_configuration() -> None:
    # The node's Gres counts each slice as a GPU: 3, and Slurm tracks the slice type.
    assert parse_gres(DOC_MIG_NODE_GRES) == ("a100", 3)
    assert "gres/gpu:a100_3g.20gb" in DOC_MIG_ACCOUNTING.split("=", 1)[1].split(",")


def test_one_slice_is_not_a_whole_gpu() -> None:
    # What the ledger counts today: the untyped total, one whole GPU.
    assert gpus_from_tres(ONE_SLICE) == ("a100_3g.20gb", 1)
    assert gpu_share_from_tres(ONE_SLICE, COMPUTE) == ("a100_3g.20gb", 3 / 7)
    assert gpu_share_from_tres(ONE_SLICE, MEMORY) == ("a100_3g.20gb", 0.5)


def test_whole_node_counts_each_gpu_once() -> None:
    assert shares_from_tres(WHOLE_NODE, COMPUTE) == {
        "a100": Fraction(1),
        "a100_3g.20gb": Fraction(6, 7),
    }
    assert gpu_share_from_tres(WHOLE_NODE, COMPUTE) == ("a100", float(Fraction(13, 7)))
    # by memory the two 20 GB slices are the whole 40 GB A100
    assert gpu_share_from_tres(WHOLE_NODE, MEMORY) == ("a100", 2.0)


def test_untracked_whole_type_is_left_in_the_untyped_total() -> None:
    # AccountingStorageTRES lists the slice type but not `a100`: the whole GPU is what is
    # left of the untyped total once the slices are taken out.
    tres = "gres/gpu=3,gres/gpu:a100_3g.20gb=2"
    assert shares_from_tres(tres, COMPUTE) == {"a100_3g.20gb": Fraction(6, 7), None: 1}


def test_untyped_on_a_node_of_one_profile() -> None:
    # no type tracked; the node's GPUs are all 1g.10gb slices
    assert gpu_share_from_tres("gres/gpu=2", COMPUTE, gpu_type="h100_1g.10gb") == (
        "h100_1g.10gb",
        2 / 7,
    )
    # the node's type is a whole GPU: the untyped count is whole GPUs
    assert gpu_share_from_tres("gres/gpu=2", COMPUTE, gpu_type="h100") == (None, 2.0)


def test_contradicting_counts_quote_the_tres() -> None:
    with pytest.raises(SliceError, match=r"above the untyped total \(1\).*in TRES"):
        shares_from_tres("gres/gpu=1,gres/gpu:a100_3g.20gb=2", COMPUTE)
    with pytest.raises(SliceError, match=r"not a MIG profile name.*in TRES"):
        shares_from_tres("gres/gpu=1,gres/gpu:a100_3g.20gb+=1", COMPUTE)


def test_sacct_json_list() -> None:
    items = [
        {"type": "cpu", "name": "", "id": 1, "count": 1},
        {"type": "gres", "name": "gpu", "id": 1001, "count": 1},
        {"type": "gres", "name": "gpu:a100_3g.20gb", "count": {"set": True, "number": 1}},
    ]
    assert gpu_share_from_tres_list(items, COMPUTE) == ("a100_3g.20gb", 3 / 7)
    assert gpus_from_tres_list(items) == ("a100_3g.20gb", 1)


# --- shards ---------------------------------------------------------------------------


def test_shards_book_their_share_of_a_gpu() -> None:
    # the guide's node: 64 shards on 2 GPUs, 32 per GPU
    rules = SliceRules(shards_per_gpu={"tux1": 32})
    assert gpu_share_from_tres(SLURM_TEST_SHARD_ALLOC, rules, node="tux1") == (None, 3 / 32)
    assert shard_share(32, rules, node="tux1") == 1
    # by GPU type, a node's entry winning
    by_type = SliceRules(shards_per_gpu={"h100": 8, "n9": 4})
    assert gpu_share_from_tres("gres/shard=2", by_type, gpu_type="h100") == (None, 0.25)
    assert gpu_share_from_tres("gres/shard=2", by_type, node="n9", gpu_type="h100") == (None, 0.5)


def test_typed_shards_counted_once() -> None:
    rules = SliceRules(shards_per_gpu={"nvidia_gb10": 80})
    tres = "billing=10,cpu=10,gres/shard:nvidia_gb10=40,gres/shard=40,mem=50G,node=1"
    assert shares_from_tres(tres, rules) == {"nvidia_gb10": Fraction(1, 2)}


def test_shards_without_a_count_per_gpu() -> None:
    with pytest.raises(SliceError, match=r"no shards per GPU for 'n1' or 'h100'.*in TRES"):
        gpu_share_from_tres(SLURM_TEST_SHARD_ALLOC, SliceRules(), node="n1", gpu_type="h100")


def test_shards_beside_whole_gpus() -> None:
    # shards are not in gres/gpu: a GPU held whole and shards of another add up
    rules = SliceRules(shards_per_gpu={"n1": 4})
    assert gpu_share_from_tres("gres/gpu=1,gres/shard=2", rules, node="n1") == (None, 1.5)


# --- plain GPU jobs unchanged ---------------------------------------------------------


@pytest.mark.parametrize(
    "tres",
    [
        RECORDED_PLAIN_ALLOC,
        "cpu=1,gres/gpu=2,gres/gpu:h100=2",
        "gres/gpu=4",
        "gres/gpu:a100=2,gres/gpu:v100=3",
        "cpu=8,gres/gpumem=80G,gres/gpuutil=0,gres/gpu=1",
        "cpu=4,mem=16G",
        "",
    ],
)
def test_plain_gpu_jobs_unchanged(tres: str) -> None:
    gpu_type, gpus = gpus_from_tres(tres)
    for rules in (COMPUTE, MEMORY):
        assert gpu_share_from_tres(tres, rules) == (gpu_type, float(gpus))


def test_recorded_plain_job() -> None:
    assert gpu_share_from_tres(RECORDED_PLAIN_ALLOC, COMPUTE) == ("rtx2080ti", 4.0)
    assert shares_from_tres("cpu=4,mem=16G", COMPUTE) == {}
