"""The ingest scenario the bulk and roll-up tests share (not a test module): a fleet of
four nodes, records of a first ingest (`ended=False`: multi-node, month-spanning, running,
serving jobs, a record listed twice, one without GPU time) and of a second where the running
job has ended, and the serving job's compute samples (`later=True`: one more arrived).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from accounting.attribution import Context, ServingPoint
from bridge.slurm.model import AccountingRecord
from tests.db.helpers import rec

T0 = datetime(2026, 10, 31, 21, 17, 3, 250_000, tzinfo=UTC)  # before a month boundary
NOW = datetime(2026, 11, 2, tzinfo=UTC)
NODES = ("n1", "n2", "n3", "n4")
CTX = Context(
    pool_of_node={"n1": "training", "n2": "training", "n3": "elastic", "n4": "inference"},
    gpu_type_of_node=dict.fromkeys(NODES, "h100"),
    workload_of_partition={"train": "training", "elastic": "elastic", "infer": "inference"},
    team_of_account={"bridge": "platform"},
    team_of_model={"busy": "team-vision"},
    known_gpu_types=frozenset({"h100"}),
    horizon=T0 + timedelta(hours=5),
)


def records(ended: bool) -> list[AccountingRecord]:
    h = timedelta(hours=1)
    running = rec("5", T0, T0 + 3 * h if ended else None, nodes=("n3",), partition="elastic",
                  state="COMPLETED" if ended else "RUNNING")  # fmt: skip
    return [
        rec("1", T0, T0 + 2 * h, nodes=("n1", "n2"), gpus=6),
        rec("2", T0 + timedelta(minutes=5), T0 + timedelta(minutes=50), account="bridge"),
        rec("3", None, None, gpus=0, state="CANCELLED"),
        running,
        rec(
            "7",
            T0,
            T0 + 4 * h,
            nodes=("n4",),
            gpus=1,
            partition="infer",
            account="bridge",
            comment="stb:triton",
        ),
        rec(
            "8",
            T0 + 3 * h,
            T0 + 4 * h,
            nodes=("n4",),
            gpus=2,
            partition="infer",
            comment="stb:triton,stb:workload=inference",
        ),
        rec("2", T0 + timedelta(minutes=5), T0 + timedelta(minutes=55), account="bridge"),
        *(
            rec(f"9_{k}", T0 + k * timedelta(minutes=7), T0 + k * h, nodes=(NODES[k % 3],))
            for k in range(1, 6)
        ),
    ]


def points(later: bool) -> list[ServingPoint]:
    i = "10.0.0.4:8000"
    pts = [
        ServingPoint("7", i, "busy", T0 + timedelta(minutes=30), 600e6),
        ServingPoint("7", i, "busy", T0 + timedelta(minutes=95), 100e6),  # a reset
        ServingPoint("7", i, "echo", T0 + timedelta(minutes=150), 2_000e6),
    ]
    if later:
        pts.append(ServingPoint("7", i, "echo", T0 + timedelta(minutes=230), 2_900e6))
    return pts
