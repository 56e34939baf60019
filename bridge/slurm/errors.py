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


#: Phrases with which Slurm's clients say the controller or slurmdbd did not answer.
UNREACHABLE_PHRASES = (
    "unable to contact slurm controller",
    "connection refused",
    "socket timed out",
    "zero bytes were transmitted",
    "problem talking to the database",
    "connection timed out",
    "communication connection failure",
)


def from_message(command: str, message: str) -> SlurmError:
    """The typed error for Slurm's own words: unreachable when they say the controller or
    the database did not answer, else a rejection quoting them."""
    if any(p in message.lower() for p in UNREACHABLE_PHRASES):
        return ControllerUnreachable(f"{command}: {message}")
    return CommandRejected(command, message)
