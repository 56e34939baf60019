"""`stb models profile MODEL`: measure an LLM's token profile on a running Triton server
(`bridge.models.profile_run`), print it with what one replica carries at the model's token
SLOs, and keep it with the model in the repository (`bridge.models.profile.write_profile`,
`<repository>/<model>/stb_profile.json`, one entry per version). Registered on `stb
models` by `bridge.models.cli`. Every refusal is one `error:` line and exit status 1,
before any stream is sent where it can be; nothing is written on a failure or with
--dry-run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from bridge.cli_text import fail, say
from bridge.config_cli import ConfigOpt, load_or_exit
from bridge.models.profile import PROFILE_FILE, ProfileError, write_profile
from bridge.models.profile_run import (
    OUTPUT_TOKENS,
    PROMPT_TOKENS,
    REQUESTS,
    ProfileRunError,
    capacity,
    describe,
    make_plan,
    measure,
)
from bridge.models.repo import ModelRepository, RepositoryError
from bridge.triton.catalog import ModelCatalog

console = Console(stderr=True)


def _lengths(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ProfileRunError(
            f"--prompt-tokens takes token counts separated by commas, got {text!r}"
        ) from None


def profile(
    name: Annotated[str, typer.Argument(help="The model (an LLM with a token SLO).")],
    version: Annotated[
        int | None, typer.Option(help="The version measured (default: the repository's newest).")
    ] = None,
    url: Annotated[
        str | None,
        typer.Option(
            help="Where to send the streams: a Triton server's HTTP address serving the "
            "version, or the bridge's nginx (default: \\[routing] listen). Loopback only."
        ),
    ] = None,
    requests: Annotated[
        int,
        typer.Option(
            help="Streams to send, at least 3 per concurrency (1 .. the model's instances), "
            "at most 200."
        ),
    ] = REQUESTS,
    prompt_tokens: Annotated[
        str, typer.Option(help="The prompt lengths, in tokens as the server counts them.")
    ] = ",".join(map(str, PROMPT_TOKENS)),
    output_tokens: Annotated[
        int, typer.Option(help="Output tokens asked of each stream.")
    ] = OUTPUT_TOKENS,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Measure and print; write nothing.")
    ] = False,
    repository: Annotated[
        Path | None, typer.Option("--repository", help="Model repository (default: the config's).")
    ] = None,
    config: ConfigOpt = None,
) -> None:
    """Measure an LLM's token profile: streams at 1 .. `sequences` at once (the model's
    instances: never more than its slots, so no request waits in Triton's queue) and three
    prompt lengths; fit the prefill (per prompt token and fixed) and the time per output
    token at each concurrency; print it with one replica's capacity at the model's TTFT and
    TPOT SLOs; write it for the version into <model>/stb_profile.json (the daemon sizes
    the model's replicas by it). About half a minute with the defaults."""
    cfg = load_or_exit(config)
    repo = ModelRepository(repository or cfg.triton.model_repository)
    try:
        model_dir = repo.model_dir(name)
        versions = repo.versions(name)
        if not (model_dir / "config.pbtxt").is_file() or not versions:
            raise ProfileRunError(f"{name}: no such model (with a version) in {repo.root}")
        chosen = versions[-1] if version is None else version
        if chosen not in versions:
            raise ProfileRunError(
                f"{name}: no version {chosen} in the repository (it has "
                f"{', '.join(map(str, versions))})"
            )
        fact = ModelCatalog(repo.root, cfg.models, say=False).facts().facts.get(name)
        if fact is None or fact.model is None:
            why = "; ".join(fact.problems) or fact.why if fact else "not in the catalog"
            raise ProfileRunError(f"{name}: not a model the bridge scales ({why})")
        model = fact.model
        if not model.has_token_slo:
            raise ProfileRunError(
                f"{name} has no token SLO (stb.slo_ttft_p99_ms or stb.slo_tpot_p99_ms): a "
                "token profile sizes only an LLM's replicas"
            )
        sequences = model.instances or 1
        plan = make_plan(sequences, requests, _lengths(prompt_tokens), output_tokens)
        target = url or cfg.routing.listen
        say(
            console,
            f"profiling {name} version {chosen} at {target}: {plan.streams} streams at 1.."
            f"{sequences} at once, prompts {'/'.join(map(str, plan.prompt_tokens))} tokens, "
            f"{plan.output_tokens} tokens out",
        )
        run = measure(target, name, str(chosen), plan, say=lambda m: say(console, m))
    except (ProfileRunError, RepositoryError) as exc:
        raise fail(exc) from exc
    prof = run.profile
    slo_ttft = model.slo_ttft_p99_ms / 1000 if model.slo_ttft_p99_ms else None
    slo_tpot = model.slo_tpot_p99_ms / 1000 if model.slo_tpot_p99_ms else None
    slos = ", ".join(
        f"{k} p99 {v:g} ms"
        for k, v in (("TTFT", model.slo_ttft_p99_ms), ("TPOT", model.slo_tpot_p99_ms))
        if v is not None
    )
    out = Console()
    say(out, f"{name} version {chosen}: {prof.sequences} sequences; {describe(prof)}")
    say(out, f"one replica at the SLOs ({slos}), {plan.output_tokens} tokens out:")
    mix = [p.prompt_tokens for p in run.points]
    for label, prompts in [
        *((f"{p} prompt tokens", [float(p)]) for p in plan.prompt_tokens),
        ("the mix measured", mix),
    ]:
        cap = capacity(prof, prompts, [plan.output_tokens] * len(prompts), slo_ttft, slo_tpot)
        if cap.reason is not None:
            say(out, f"  {label}: no load ({cap.reason})")
        else:
            say(
                out,
                f"  {label}: {cap.rate:.2f} requests/s, {cap.output_tps:.1f} output tokens/s",
            )
    say(out, f"load average of this machine: {os.getloadavg()[0]:.1f}")
    if dry_run:
        say(out, "--dry-run: nothing written")
        return
    try:
        path = write_profile(model_dir, str(chosen), prof, len(run.points))
    except ProfileError as exc:
        raise fail(exc) from exc
    say(out, f"written: {path} ({len(run.points)} streams; {PROFILE_FILE} version {chosen})")
