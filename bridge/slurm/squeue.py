"""`squeue --json` -> jobs (`parse_squeue_json`, both OpenAPI shapes, through
`bridge.slurm.parse`'s accessors), and `filter_jobs`, the selection `SlurmProtocol.jobs`
makes of them. slurmrestd's `GET jobs` gives the same document (`bridge.slurm.rest`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Unpack

from bridge.slurm.errors import UnparseableOutput
from bridge.slurm.model import Job, JobFilter
from bridge.slurm.parse import (
    NULLS,
    as_text,
    bad_job,
    format_job_id,
    gpus_from_tres,
    load_json,
    nodes_of,
    num,
    parse_gres,
    run_end,
    shown_state,
    states,
    timestamp,
)


def filter_jobs(jobs: Iterable[Job], **filters: Unpack[JobFilter]) -> list[Job]:
    """The jobs `SlurmProtocol.jobs` asks for (`JobFilter`): with the comment `tag`, on
    `node`, in `partition`, in one of `states` (Slurm state names, any case); None: any."""
    tag, node = filters.get("tag"), filters.get("node")
    partition, states = filters.get("partition"), filters.get("states")
    wanted = {s.upper() for s in states} if states is not None else None
    return [
        j
        for j in jobs
        if (tag is None or tag in j.tags)
        and (node is None or node in j.nodes)
        and (partition is None or j.partition == partition)
        and (wanted is None or j.state in wanted)
    ]


def parse_squeue_json(text: str) -> list[Job]:
    jobs = []
    for j in load_json(text, "squeue --json", "jobs"):
        try:
            st = states(j["job_state"])
            pending = st[:1] == ["PENDING"]
            alloc_tres = as_text(j.get("tres_alloc_str"))
            _, gpus = gpus_from_tres(alloc_tres)
            if not gpus:
                gpus = parse_gres(as_text(j.get("tres_per_node")).replace("gres:", ""))[1]
            job_id = format_job_id(
                int(j["job_id"]),
                num(j.get("array_job_id")),
                num(j.get("array_task_id")),
                as_text(j.get("array_task_string")),
                num(j.get("array_max_tasks")),
            )
            nodes = as_text(j.get("nodes"))
            jobs.append(
                Job(
                    job_id=job_id,
                    name=as_text(j.get("name")),
                    partition=as_text(j.get("partition")),
                    account=as_text(j.get("account")),
                    user=as_text(j.get("user_name")),
                    state=shown_state(st),
                    reason=""
                    if as_text(j.get("state_reason")) in NULLS
                    else as_text(j["state_reason"]),
                    nodes=nodes_of(nodes, nodes),
                    comment=as_text(j.get("comment")),
                    gpus=gpus,
                    alloc_tres="" if alloc_tres in NULLS else alloc_tres,
                    restarts=num(j.get("restart_cnt")) or 0,
                    submit_time=timestamp(j.get("submit_time")),
                    # For a pending job squeue gives an expected start; that is not a start.
                    start_time=None if pending else timestamp(j.get("start_time")),
                    requested_nodes=nodes_of(
                        as_text(j.get("required_nodes")), as_text(j.get("required_nodes"))
                    ),
                    end_time=run_end(
                        timestamp(j.get("end_time")), num(j.get("time_limit")), pending
                    ),
                )
            )
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise UnparseableOutput(bad_job("squeue", exc), json.dumps(j)[:2000]) from exc
    return jobs
