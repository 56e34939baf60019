"""Typed Slurm errors. The daemon retries `transient` ones on a later tick and stops the
lease on the others; no caller needs to read message text to decide."""

from __future__ import annotations


class SlurmError(RuntimeError):
    """Base of every error the Slurm adapter raises."""

    transient = False


class ControllerUnreachable(SlurmError):
    """slurmctld (or slurmdbd, for accounting) did not answer: retry later."""

    transient = True


class CommandRejected(SlurmError):
    """Slurm understood the request and refused it; the message quotes Slurm's words."""

    def __init__(self, command: str, slurm_message: str) -> None:
        super().__init__(f"{command}: {slurm_message}")
        self.command = command
        self.slurm_message = slurm_message


class UnparseableOutput(SlurmError):
    """Slurm answered with something the parser does not understand; quotes the raw text."""

    def __init__(self, what: str, raw: str) -> None:
        shown = raw if len(raw) <= 2000 else raw[:2000] + f"... ({len(raw)} chars)"
        super().__init__(f"cannot parse {what}: {shown!r}")
        self.what = what
        self.raw = raw
