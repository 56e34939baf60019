"""smol: a real small LLM on CPU, streaming one response per generated token.

SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) on llama-cpp-python, as a decoupled
Python-backend model: the lab's stand-in for what sites serve with Triton's vLLM backend.
`./deploy/bootstrap.sh` installs llama-cpp-python (the `llm` extra) and puts the GGUF in
the environment Triton's Python stub runs in: `<venv>/share/stb-models/` (the config
parameter `gguf` names it there, or in $STB_MODELS_DIR; an absolute path is taken as it
is). Without them, or under numpy 2, the load fails and says what is missing.

Requests take the shape clients of Triton's vLLM backend send (its src/model.py and
src/utils/request.py): `text_input` (the prompt), optional `stream` (BOOL: one response
per token; default false: one response at the end, prompt included unless
`exclude_input_in_output` is true), `sampling_parameters` (a JSON string) or the
request's parameters (`"parameters": {...}` of /generate) with `max_tokens` (default 16,
as vLLM's), `temperature` (default 1), `top_p`, `top_k`, `min_p`, `seed`, and the
optional `return_*` flags for `finish_reason`, `num_input_tokens`, `num_output_tokens`.
A `max_tokens` INT32 input (a top-level "max_tokens" of /generate) wins over both.
`stream` may also come as a request parameter (Triton's generate documentation puts it
there). Streaming, each generated token is one response (its text may be empty: a token
that ends inside a UTF-8 character, or the end-of-sequence token), the last one carrying
the final flag: a client counts exactly `vllm:generation_tokens_total` events.

One instance runs one sequence at a time (`execute` generates; Triton queues the rest:
`nv_inference_pending_request_count`), so the instance count is the number of sequences a
replica runs at once; each instance has its own llama.cpp context and `n_threads` threads.

Metrics, through Triton's custom metrics API (pb_utils.MetricFamily), are those Triton's
vLLM backend reports, same names, kinds, buckets and labels (model, version): see
`metric_specs`. Time to first token and end-to-end latency count from when an instance
takes the request; the time queued in Triton before that is Triton's own
(`nv_inference_queue_duration_us`, `nv_inference_queue_summary_us`).

The pure parts (prompt format, request parsing, token accounting, the metric table) import
neither Triton nor llama.cpp: tests/unit/test_llm_model.py loads this file outside Triton.
"""

from __future__ import annotations

import codecs
import itertools
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # outside Triton (the unit tests): the pure parts only
    pb_utils = None

#: where ./deploy/bootstrap.sh puts the GGUF: in the environment whose python3 runs the
#: Python backend's stub (the lab puts that environment first on the job's PATH), so a
#: copy of the model repository anywhere still finds it
MODELS_DIR = Path(sys.prefix) / "share" / "stb-models"
BOOTSTRAP = "./deploy/bootstrap.sh"

# ---- metrics: Triton's vLLM backend ---------------------------------------------------
# Names, descriptions, kinds and buckets as in triton-inference-server/vllm_backend
# src/utils/metrics.py (class TritonMetrics) at commit
# 8de0c148bda1da25de1e05ffaaf67116dacc7264 (2026-01-09; the file last changed in
# b4cd9a7a44f0a50017db45b94f238815d5f5fb55), labels {"model", "version"} as its
# src/model.py `_setup_metrics` sets them. That backend reports no gauges through Triton
# (no vllm:num_requests_running / _waiting, no vllm:request_success_total: those are
# vLLM's own server's); a request's time waiting is Triton's queue here.

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0)  # fmt: skip
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
N_BUCKETS = (1, 2, 5, 10, 20)


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """vLLM's `build_1_2_5_buckets` (vllm/v1/metrics/loggers.py): 1, 2, 5, 10, 20, 50, ...
    up to `max_value` (the model's context length there and here)."""
    out: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(value)
        exponent += 1


@dataclass(frozen=True)
class MetricSpec:
    name: str
    description: str
    kind: str  # "counter" or "histogram"
    buckets: tuple[float, ...] | None = None


def metric_specs(max_model_len: int) -> tuple[MetricSpec, ...]:
    """Every metric family this model reports, in the backend's order."""
    lengths = tuple(float(b) for b in build_1_2_5_buckets(max_model_len))
    return (
        MetricSpec("vllm:prompt_tokens_total", "Number of prefill tokens processed.", "counter"),
        MetricSpec(
            "vllm:generation_tokens_total", "Number of generation tokens processed.", "counter"
        ),
        MetricSpec(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            "histogram",
            TTFT_BUCKETS,
        ),
        MetricSpec(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            "histogram",
            TPOT_BUCKETS,
        ),
        MetricSpec(
            "vllm:e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            "histogram",
            E2E_BUCKETS,
        ),
        MetricSpec(
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            "histogram",
            lengths,
        ),
        MetricSpec(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            "histogram",
            lengths,
        ),
        MetricSpec(
            "vllm:request_params_n",
            "Histogram of the n request parameter.",
            "histogram",
            tuple(float(b) for b in N_BUCKETS),
        ),
    )


# ---- prompt format ---------------------------------------------------------------------

#: SmolLM2-Instruct's chat template (ChatML; the GGUF's tokenizer.chat_template) puts this
#: system message first when the conversation has none
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def format_prompt(text: str, prompt_format: str, system: str = DEFAULT_SYSTEM) -> str:
    """The text the model reads. "chatml": `text` as the user's one message, with the
    template's system message and the assistant's turn opened (what an instruct model
    answers well); "raw": `text` as it is (what the vLLM backend does with text_input)."""
    if prompt_format == "raw":
        return text
    if prompt_format != "chatml":
        raise ValueError(f"prompt_format must be 'chatml' or 'raw', not {prompt_format!r}")
    return (
        f"<|im_start|>system\n{system}<|im_end|>\n"
        f"<|im_start|>user\n{text}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


# ---- requests --------------------------------------------------------------------------


class RequestError(ValueError):
    """A request this model refuses; the message is the client's error."""


@dataclass(frozen=True)
class Sampling:
    max_tokens: int = 16  # vLLM's SamplingParams default
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # vLLM's "all tokens"
    min_p: float = 0.0
    seed: int | None = None


@dataclass(frozen=True)
class GenerateRequest:
    text: str
    stream: bool
    #: non-streaming only: the prompt before the answer in text_output (vLLM's default)
    prepend_input: bool
    sampling: Sampling
    #: which optional outputs to send: finish_reason, num_input_tokens, num_output_tokens
    returns: frozenset[str] = frozenset()


RETURN_FLAGS = {
    "return_finish_reason": "finish_reason",
    "return_num_input_tokens": "num_input_tokens",
    "return_num_output_tokens": "num_output_tokens",
}


def _flag(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes")
    return bool(value)


def parse_request(
    inputs: dict[str, object], parameters: str | dict[str, object] | None, default_max: int = 16
) -> GenerateRequest:
    """A request from its input tensors' first elements (`text_input`, `stream`,
    `max_tokens`, `exclude_input_in_output`, `sampling_parameters`, `return_*`; absent
    ones left out) and its parameters (a JSON object, as `request.parameters()` gives it).
    Sampling comes from the `sampling_parameters` input when there is one, else from the
    parameters, as in the vLLM backend; the `max_tokens` input wins over both."""
    text = inputs.get("text_input")
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if not isinstance(text, str) or not text:
        raise RequestError("text_input is missing or empty")
    params: dict[str, object]
    raw = inputs.get("sampling_parameters")
    source = raw if raw is not None else parameters
    if isinstance(source, bytes):
        source = source.decode("utf-8")
    try:
        params = json.loads(source) if isinstance(source, str) and source else dict(source or {})
    except (ValueError, TypeError) as exc:
        raise RequestError(f"sampling parameters are not a JSON object: {exc}") from exc
    if not isinstance(params, dict):
        raise RequestError("sampling parameters are not a JSON object")
    # the request's own parameters may carry stream too ({"parameters": {"stream": true}})
    request_params = parameters if isinstance(parameters, dict) else _loads(parameters)
    stream_value = inputs.get("stream", request_params.get("stream", params.get("stream")))
    stream = _flag(stream_value) if stream_value is not None else False
    exclude = inputs.get("exclude_input_in_output", params.get("exclude_input_in_output"))
    prepend = not stream if exclude is None else not _flag(exclude)
    if prepend and stream:
        raise RequestError("When streaming, `exclude_input_in_output` = False is not allowed.")
    try:
        max_tokens = int(inputs.get("max_tokens", params.get("max_tokens", default_max)))
        sampling = Sampling(
            max_tokens=max_tokens,
            temperature=float(params.get("temperature", 1.0)),
            top_p=float(params.get("top_p", 1.0)),
            top_k=int(params.get("top_k", -1)),
            min_p=float(params.get("min_p", 0.0)),
            seed=None if params.get("seed") is None else int(params["seed"]),
        )
    except (TypeError, ValueError) as exc:
        raise RequestError(f"a sampling parameter is not a number: {exc}") from exc
    if sampling.max_tokens < 1:
        raise RequestError(f"max_tokens must be at least 1, got {sampling.max_tokens}")
    if sampling.temperature < 0 or not 0 < sampling.top_p <= 1:
        raise RequestError("temperature must be >= 0 and top_p in (0, 1]")
    returns = frozenset(
        out for flag, out in RETURN_FLAGS.items() if _flag(inputs.get(flag, params.get(flag)))
    )
    return GenerateRequest(text, stream, prepend, sampling, returns)


def _loads(parameters: str | None) -> dict[str, object]:
    try:
        value = json.loads(parameters) if parameters else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


# ---- token accounting ------------------------------------------------------------------


@dataclass
class Tally:
    """One request's clock and counts: time to first token, the gaps between tokens, end
    to end, all from `arrived` (when an instance took the request)."""

    arrived: float
    prompt_tokens: int = 0
    token_times: list[float] = field(default_factory=list)
    finished: float | None = None

    def token(self, at: float) -> None:
        self.token_times.append(at)

    def finish(self, at: float) -> None:
        self.finished = at

    @property
    def generation_tokens(self) -> int:
        return len(self.token_times)

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] - self.arrived if self.token_times else None

    def gaps_s(self) -> list[float]:
        """Per output token after the first, the time since the one before (what vLLM
        observes into time_per_output_token_seconds)."""
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)]

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished is None else self.finished - self.arrived


class Utf8Stream:
    """Token bytes in, text out: a token may end inside a UTF-8 character, whose bytes
    wait for the next token (that token's text is then empty)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


def model_parameters(config: dict[str, object]) -> dict[str, str]:
    """The config.pbtxt parameters as plain strings."""
    params = config.get("parameters") or {}
    assert isinstance(params, dict)
    return {k: str(v.get("string_value", "")) for k, v in params.items()}


def gguf_path(value: str, models_dir: Path = MODELS_DIR) -> Path:
    """Where the GGUF named by the `gguf` parameter is: an absolute path as it is, a bare
    name under `models_dir` (or $STB_MODELS_DIR when set)."""
    path = Path(value).expanduser()
    if path.is_absolute():
        return path
    base = Path(os.environ.get("STB_MODELS_DIR") or models_dir)
    return base / path


# ---- Triton ----------------------------------------------------------------------------


def _string_tensor(name: str, values: list[str]):
    return pb_utils.Tensor(name, np.array([v.encode("utf-8") for v in values], dtype=np.object_))


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.name = args["model_name"]
        params = model_parameters(config)
        if int(np.__version__.split(".")[0]) >= 2:
            raise pb_utils.TritonModelException(
                f"{self.name}: numpy {np.__version__} in {sys.prefix}: the wheel's Python "
                "backend stub reads TYPE_STRING tensors only under numpy < 2 (the `lab` "
                f"extra pins it; run {BOOTSTRAP})"
            )
        path = gguf_path(params.get("gguf") or "SmolLM2-135M-Instruct.Q4_1.gguf")
        if not path.is_file():
            raise pb_utils.TritonModelException(
                f"{self.name}: no GGUF at {path} (config parameter gguf, "
                f"$STB_MODELS_DIR or {MODELS_DIR}): {BOOTSTRAP} fetches it"
            )
        try:
            import llama_cpp
        except ImportError as exc:
            raise pb_utils.TritonModelException(
                f"{self.name}: llama-cpp-python is not installed in {sys.prefix} ({exc}): "
                f"{BOOTSTRAP} installs it (the `llm` extra)"
            ) from exc
        self.llama_cpp = llama_cpp
        self.n_ctx = int(params.get("n_ctx") or 2048)
        self.default_max = int(params.get("default_max_tokens") or 16)
        self.prompt_format = params.get("prompt_format") or "chatml"
        # The lab's pace (0: none): at least this long between two tokens of a sequence.
        # The lab's nodes share the host's CPUs, so without it a second replica adds no
        # compute; paced, a replica's token rate is its own, as on a GPU of its own.
        self.token_interval_s = float(params.get("token_interval_ms") or 0) / 1000.0
        format_prompt("x", self.prompt_format)  # refuses an unknown format at load
        self.llm = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=self.n_ctx,
            n_threads=int(params.get("n_threads") or 1),
            n_threads_batch=int(params.get("n_threads") or 1),
            verbose=False,
        )
        self._vocab = self.llm._model.vocab
        # One token before the first request (not counted): the first evaluation pages the
        # weights in and sizes llama.cpp's buffers, about 0.3 s a request would otherwise
        # wait on top of its own prefill.
        warm = self.llm.tokenize(format_prompt("Hi.", self.prompt_format).encode(), special=True)
        first = self.llm.generate(warm, temp=0.0, reset=True)
        next(first)
        first.close()
        self._families = {}
        self._metrics = {}
        labels = {"model": self.name, "version": args["model_version"]}
        # Histograms: the lab's tritonserver (2.51, nvidia-pytriton 0.7.0) has them.
        kinds = {
            "counter": pb_utils.MetricFamily.COUNTER,
            "histogram": pb_utils.MetricFamily.HISTOGRAM,
        }
        # Kept on self: a MetricFamily Python collects makes every later update fail.
        for spec in metric_specs(self.n_ctx):
            family = pb_utils.MetricFamily(spec.name, spec.description, kinds[spec.kind])
            self._families[spec.name] = family
            if spec.buckets is None:
                self._metrics[spec.name] = family.Metric(labels=labels)
            else:
                self._metrics[spec.name] = family.Metric(labels=labels, buckets=list(spec.buckets))

    def _count(self, name: str, value: float) -> None:
        if value:
            self._metrics[name].increment(value)

    def _observe(self, name: str, value: float) -> None:
        self._metrics[name].observe(value)

    def execute(self, requests):
        for request in requests:
            arrived = time.monotonic()
            sender = request.get_response_sender()
            try:
                self._generate(request, sender, arrived)
            except RequestError as exc:
                sender.send(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
            except Exception as exc:  # the client gets it; the stub lives on
                pb_utils.Logger.log_error(f"{self.name}: generation failed: {exc!r}")
                sender.send(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(f"{self.name}: generation failed: {exc}")
                    ),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
        return None

    def _inputs(self, request) -> dict[str, object]:
        names = ("text_input", "stream", "max_tokens", "exclude_input_in_output",
                 "sampling_parameters", *RETURN_FLAGS)  # fmt: skip
        found: dict[str, object] = {}
        for name in names:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                value = tensor.as_numpy().reshape(-1)
                if value.size:
                    item = value[0]
                    found[name] = item.item() if isinstance(item, np.generic) else item
        return found

    def _generate(self, request, sender, arrived: float) -> None:
        req = parse_request(self._inputs(request), request.parameters(), self.default_max)
        prompt = format_prompt(req.text, self.prompt_format)
        tokens = self.llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
        room = self.n_ctx - len(tokens)
        if room < 1:
            raise RequestError(
                f"the prompt is {len(tokens)} tokens; the context holds {self.n_ctx}"
            )
        max_tokens = min(req.sampling.max_tokens, room)
        tally = Tally(arrived, prompt_tokens=len(tokens))
        self._count("vllm:prompt_tokens_total", len(tokens))
        if req.sampling.seed is not None:
            self.llm.set_seed(req.sampling.seed)
        text = Utf8Stream()
        pieces: list[str] = []
        reason = "length"
        generator = self.llm.generate(
            tokens,
            temp=req.sampling.temperature,
            top_p=req.sampling.top_p,
            top_k=max(req.sampling.top_k, 0),  # llama.cpp's 0 is vLLM's -1: every token
            min_p=req.sampling.min_p,
            repeat_penalty=1.0,
            reset=True,  # keeps the KV cache of a prompt prefix this context saw last
        )
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for token in generator:
            now = time.monotonic()
            end = bool(self.llama_cpp.llama_vocab_is_eog(self._vocab, token))
            piece = "" if end else text.push(self.llm.detokenize([token]))
            tally.token(now)
            last = end or tally.generation_tokens >= max_tokens
            if last:
                piece += text.flush()
                reason = "stop" if end else "length"
            if req.stream:
                response = self._response(req, [piece], tally, reason if last else None)
                sender.send(response, flags=final if last else 0)
            else:
                pieces.append(piece)
            self._count("vllm:generation_tokens_total", 1)
            if tally.generation_tokens == 1:
                self._observe("vllm:time_to_first_token_seconds", now - arrived)
            else:
                self._observe("vllm:time_per_output_token_seconds", now - tally.token_times[-2])
            if last:
                break
            if self.token_interval_s > 0:
                time.sleep(max(0.0, now + self.token_interval_s - time.monotonic()))
            if sender.is_cancelled():  # the client went away: stop generating for it
                reason = "abort"
                cancelled = pb_utils.TritonError(
                    "Request was cancelled", pb_utils.TritonError.CANCELLED
                )
                sender.send(pb_utils.InferenceResponse(error=cancelled), flags=final)
                break
        generator.close()
        tally.finish(time.monotonic())
        if not req.stream and reason != "abort":
            body = "".join(pieces)
            if req.prepend_input:
                body = req.text + body
            sender.send(self._response(req, [body], tally, reason), flags=final)
        self._observe("vllm:e2e_request_latency_seconds", tally.e2e_s or 0.0)
        self._observe("vllm:request_prompt_tokens", tally.prompt_tokens)
        self._observe("vllm:request_generation_tokens", tally.generation_tokens)
        self._observe("vllm:request_params_n", 1)

    def _response(self, req: GenerateRequest, text: list[str], tally: Tally, reason):
        outputs = [_string_tensor("text_output", text)]
        if "finish_reason" in req.returns:
            outputs.append(_string_tensor("finish_reason", [reason or "None"]))
        if "num_input_tokens" in req.returns:
            outputs.append(
                pb_utils.Tensor("num_input_tokens", np.array([tally.prompt_tokens], np.uint32))
            )
        if "num_output_tokens" in req.returns:
            count = 1 if req.stream else tally.generation_tokens
            outputs.append(pb_utils.Tensor("num_output_tokens", np.array([count], np.uint32)))
        return pb_utils.InferenceResponse(output_tensors=outputs)

    def finalize(self) -> None:
        self.llm = None
        self._metrics.clear()
        self._families.clear()
