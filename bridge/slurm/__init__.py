"""The Slurm adapter: what the daemon and the ledger need from Slurm, behind one
`SlurmProtocol` (`protocol.py`), with a backend on Slurm's command-line tools
(`cli.py`, Slurm 22.05 and later), one on slurmrestd with JWTs (`rest.py`, OpenAPI
v0.0.38 of Slurm 22.05) and one on pyslurm (`pyslurm_backend.py`, for the Slurm release
the pyslurm wheel was built against); `select.py` picks one. Parsers are pure (`parse.py`,
`rest_parse.py`)."""

from bridge.slurm.errors import (
    CommandRejected,
    ControllerUnreachable,
    SlurmError,
    UnparseableOutput,
)
from bridge.slurm.model import AccountingRecord, Job, JobSpec, Node, Partition, Reservation
from bridge.slurm.protocol import SlurmProtocol

__all__ = [
    "AccountingRecord",
    "CommandRejected",
    "ControllerUnreachable",
    "Job",
    "JobSpec",
    "Node",
    "Partition",
    "Reservation",
    "SlurmError",
    "SlurmProtocol",
    "UnparseableOutput",
]
