"""Per-model service times (compute time per successful request) from Triton's own
counters: through Prometheus (`service_query`, `service_from_prometheus`) or from the
samples the daemon stored in the ledger (`service_from_increases`,
`read_ledger_service`). The compute counters are input + infer + output, as the
policy's capacity model counts them. Called by `stb simulate --service-from`."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from accounting.serving import Increase, window_increases
from bridge.sim.inputs.common import InputError, open_database, positive, read_json, shown_db
from bridge.sim.inputs.prometheus import answer_result, labels_text, model_label


def service_query(window_s: float, label: str = "model") -> str:
    """The instant query of each model's mean compute time per successful request over
    the last `window_s` seconds, in microseconds: Triton's compute counters (input, infer
    and output, as the capacity model counts them) over its success counter. Each
    counter is summed by `label` before they are added: `increase` drops the metric's
    name, so the three unsummed would collide (Prometheus refuses that)."""
    positive("window_s", window_s)
    w = f"{max(1, round(window_s))}s"
    compute = " + ".join(
        f"sum by ({label}) (increase(nv_inference_compute_{part}_duration_us[{w}]))"
        for part in ("input", "infer", "output")
    )
    return f"({compute}) / sum by ({label}) (increase(nv_inference_request_success[{w}]))"


def service_from_prometheus(
    answer_doc: Mapping[str, Any] | Path, *, label: str = "model"
) -> dict[str, float]:
    """Per model, its service time in seconds from an answer of `service_query` (an
    instant vector of microseconds per request; a Path: a saved answer). A model with no
    request in the window (0/0: NaN) has no value and is left out; a value that is
    negative, or a series without the label, is refused."""
    where = f"service answer {answer_doc}" if isinstance(answer_doc, Path) else "service answer"
    doc = read_json(answer_doc, "service answer") if isinstance(answer_doc, Path) else answer_doc
    out: dict[str, float] = {}
    for i, item in enumerate(answer_result(doc, where, "vector")):
        model, metric = model_label(item, i, label, where)
        pair = item.get("value")
        try:
            if not isinstance(pair, list | tuple) or len(pair) != 2:
                raise TypeError
            us = float(pair[1])
        except (TypeError, ValueError):
            raise InputError(
                f'{where}: series {i} {labels_text(metric)}: value {pair!r} is not [time, "value"]'
            ) from None
        if math.isnan(us) or math.isinf(us):
            continue  # no request counted: no service time
        if us < 0:
            raise InputError(f"{where}: series {i} {labels_text(metric)}: {us!r} us per request")
        if model in out:
            raise InputError(f"{where}: model {model!r} twice: sum the query by {label}")
        out[model] = us / 1e6
    return out


def service_from_increases(increases: Iterable[Increase]) -> dict[str, float]:
    """Per model, its service time in seconds from the Triton counters the daemon stored
    in the ledger (`accounting.serving`): the compute time over the successful requests
    of the intervals that counted both. A model with no request has none."""
    compute: dict[str, float] = defaultdict(float)
    requests: dict[str, float] = defaultdict(float)
    for inc in increases:
        if inc.requests is None:
            continue
        compute[inc.model] += inc.compute_us
        requests[inc.model] += inc.requests
    return {m: compute[m] / 1e6 / requests[m] for m in sorted(compute) if requests[m] > 0}


def read_ledger_service(url: str, start: datetime, end: datetime) -> dict[str, float]:
    """`service_from_increases` of the ledger at `url` over [start, end)."""
    engine = open_database(url, "ledger")
    try:
        return service_from_increases(window_increases(engine, start, end))
    except SQLAlchemyError as exc:
        msg = str(exc).splitlines()[0]
        raise InputError(f"ledger {shown_db(url)}: cannot read serving samples: {msg}") from None
    finally:
        engine.dispose()
