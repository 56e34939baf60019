"""The GPU paths on a real GPU: the Slurm prolog/epilog's NVML sampler
(slurm_plugins/gpu_sampler.py) around a real model load and generation, beside the same
generation on the CPU in the same run.

Run where a GPU is (this project's machines have none; a lent GPU machine has torch,
transformers and nvidia-ml-py): it needs the lab's LLM's GGUF (SmolLM2-135M-Instruct,
Q4_1, which deploy/bootstrap.sh puts in .venv/share/stb-models/) and the `gguf` package,
which transformers uses to read it.

    python3 bench/gpu_device.py --gguf PATH [--tokens 64] [--out DIR]

What it does, as a Slurm job on a GPU node would see it:
1. NVML facts: driver, the GPUs, their memory, MIG mode (read only: nothing is changed).
2. `gpu_sampler.py prolog` with the variables slurmd gives a job holding GPU 0
   (SLURM_JOB_ID, SLURMD_NODENAME, SLURM_JOB_GPUS=0), sampling every 0.5 s.
3. The model: read from the GGUF, moved to the GPU (timed: file to ready), a warm-up,
   then greedy generation of `--tokens` tokens, timed; then the same on the CPU.
4. `gpu_sampler.py epilog`, and its JSON record checked: one GPU, samples taken, the
   highest memory NVML saw on the GPU at least what torch had allocated there, and a
   utilization above zero while the model generated.
Before all that, the epilog's release check (no process may hold the job's GPUs when the
node goes back), while this process has no CUDA context yet: a child process holds 1 GiB
of GPU 0, the epilog of a job on GPU 0 must name it and drain the node (through an
`scontrol` stand-in on PATH that records its arguments: there is no Slurm here); the
child killed, the same epilog must find the GPU free and drain nothing.

Ends with `RESULT ...`: the load time, tokens per second on GPU and CPU and their ratio,
the record's figures, and `nvml_path=ok` when every check held. Exit status 1 when a
check failed, 2 when no GPU was found.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SAMPLER = Path(__file__).resolve().parent.parent / "slurm_plugins" / "gpu_sampler.py"
PROMPT = "The three things a GPU cluster scheduler must balance are"


def nvml_facts() -> dict[str, object]:
    import pynvml

    pynvml.nvmlInit()
    try:
        facts: dict[str, object] = {
            "driver": pynvml.nvmlSystemGetDriverVersion(),
            "count": pynvml.nvmlDeviceGetCount(),
        }
        gpus = []
        for i in range(int(facts["count"])):  # type: ignore[call-overload]
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            try:
                mig = pynvml.nvmlDeviceGetMigMode(h)[0]
            except pynvml.NVMLError:
                mig = None
            gpus.append(
                {
                    "index": i,
                    "name": pynvml.nvmlDeviceGetName(h),
                    "uuid": pynvml.nvmlDeviceGetUUID(h),
                    "memory_total": int(mem.total),
                    "memory_used": int(mem.used),
                    "mig_mode": mig,
                }
            )
        facts["gpus"] = gpus
        return facts
    finally:
        pynvml.nvmlShutdown()


def hook(name: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, str(SAMPLER), name], env=env, capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        raise RuntimeError(f"{name} exited {done.returncode}: {done.stderr.strip()}")
    return (done.stdout + done.stderr).strip()


HOLDER = """
import sys, time, torch
x = torch.empty(2**30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("holding", flush=True)
time.sleep(120)
"""


def release_checks(base_env: dict[str, str], folder: Path) -> dict[str, bool]:
    """The epilog's release check with GPU 0 held by a child process, then free."""
    bindir = folder / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    calls = folder / "scontrol-calls.txt"
    fake = bindir / "scontrol"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    fake.chmod(0o755)
    env = dict(
        base_env,
        PATH=f"{bindir}:{base_env.get('PATH', '')}",
        SLURM_JOB_ID="4243",
        STB_GPU_RELEASE_WAIT_S="2",
        STB_GPU_RELEASE_CHECK="drain",
    )
    child = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        ready = child.stdout.readline().strip()
        held_line = hook("epilog", env) if ready == "holding" else ""
        log = (Path(env["STB_GPU_SPOOL"]) / "epilog.log").read_text()
    finally:
        child.kill()
        child.wait()
    time.sleep(1.0)
    free_env = dict(env, SLURM_JOB_ID="4244")
    hook("epilog", free_env)
    log = (Path(env["STB_GPU_SPOOL"]) / "epilog.log").read_text()
    lines = log.splitlines()
    held = next((x for x in lines if "job 4243" in x), "")
    free = next((x for x in lines if "job 4244" in x), "")
    recorded = calls.read_text() if calls.exists() else ""
    print(f"release check, held: {held}")
    print(f"release check, free: {free}")
    print(f"scontrol stand-in called with: {recorded.strip()!r}")
    del held_line
    return {
        "release_held_named": f"pid {child.pid}" in held and "drained" in held,
        "release_drain_asked": "State=DRAIN" in recorded and "NodeName=gpu0" in recorded,
        "release_free": "GPUs 0 free" in free and recorded.count("State=DRAIN") == 1,
    }


def generate(model, tokenizer, device: str, tokens: int) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """Seconds for greedy generation of `tokens` new tokens, and how many came."""
    import torch

    inputs = tokenizer(PROMPT, return_tensors="pt").to(device)
    with torch.no_grad():
        model.generate(**inputs, max_new_tokens=4, do_sample=False)  # warm-up
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate(
            **inputs, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False
        )
        if device == "cuda":
            torch.cuda.synchronize()
        took = time.perf_counter() - start
    return took, int(out.shape[1] - inputs["input_ids"].shape[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, required=True, help="the GGUF file of the lab's LLM")
    ap.add_argument("--tokens", type=int, default=64, help="tokens generated per timing")
    ap.add_argument("--out", type=Path, default=None, help="folder for the sampler's record")
    args = ap.parse_args()
    if not args.gguf.is_file():
        print(f"gpu_device: no GGUF at {args.gguf}", file=sys.stderr)
        return 2
    try:
        facts = nvml_facts()
    except Exception as exc:  # no driver, no GPU
        print(f"gpu_device: NVML found no GPU: {exc}", file=sys.stderr)
        return 2
    print("NVML:", json.dumps(facts))
    if not facts["count"]:
        print("gpu_device: NVML counts no GPU", file=sys.stderr)
        return 2

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spool = Path(tempfile.mkdtemp(prefix="stb-gpu-spool-"))
    env = dict(
        os.environ,
        SLURM_JOB_ID="4242",
        SLURMD_NODENAME="gpu0",
        SLURM_CLUSTER_NAME="device",
        SLURM_JOB_GPUS="0",
        STB_GPU_SPOOL=str(spool),
        STB_GPU_SAMPLE_S="0.5",
        # this process is the "job" and still holds its model at its epilog: say so only
        STB_GPU_RELEASE_CHECK="log",
    )
    released = release_checks(env, spool / "release")
    print("prolog:", hook("prolog", env))

    folder, name = str(args.gguf.parent), args.gguf.name
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model = model.to("cuda").eval()
    torch.cuda.synchronize()
    load_s = time.perf_counter() - start
    allocated = int(torch.cuda.memory_allocated())
    gpu_s, gpu_n = generate(model, tokenizer, "cuda", args.tokens)
    # a second of steady generation so the sampler reads the GPU busy
    busy_until = time.perf_counter() + 3.0
    while time.perf_counter() < busy_until:
        generate(model, tokenizer, "cuda", 16)
    peak = int(torch.cuda.max_memory_allocated())
    text = tokenizer.decode(
        model.generate(
            **tokenizer(PROMPT, return_tensors="pt").to("cuda"), max_new_tokens=24, do_sample=False
        )[0],
        skip_special_tokens=True,
    )
    print(f"model on GPU: loaded in {load_s:.2f} s, {allocated / 2**20:.0f} MiB allocated")
    print(f"sample: {text!r}")
    time.sleep(1.0)
    print("epilog:", hook("epilog", env))
    records = sorted(spool.glob("job-4242-gpu0-*.json"))
    record = json.loads(records[-1].read_text()) if records else {}
    print("record:", json.dumps(record))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_record.json").write_text(json.dumps({"nvml": facts, "record": record}))

    del model
    torch.cuda.empty_cache()
    start = time.perf_counter()
    cpu_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    cpu_load_s = time.perf_counter() - start
    cpu_s, cpu_n = generate(cpu_model.eval(), tokenizer, "cpu", args.tokens)

    checks = {
        "record_written": bool(record),
        "one_gpu": record.get("gpus") == ["0"],
        "sampled": (record.get("samples") or 0) >= 3,
        "memory_seen": (record.get("max_mem_bytes") or 0) >= allocated > 0,
        "busy_seen": (record.get("mean_util_pct") or 0) > 0,
        "tokens": gpu_n == args.tokens and cpu_n == args.tokens,
        **released,
    }
    failed = [k for k, ok in checks.items() if not ok]
    gpu_tps, cpu_tps = gpu_n / gpu_s, cpu_n / cpu_s
    print(f"checks: {checks}")
    print(
        f"RESULT gpu={facts['gpus'][0]['name'].replace(' ', '_')} load_s={load_s:.2f} "  # type: ignore[index]
        f"cpu_load_s={cpu_load_s:.2f} "
        f"gpu_tok_s={gpu_tps:.1f} cpu_tok_s={cpu_tps:.1f} gpu_over_cpu={gpu_tps / cpu_tps:.2f} "
        f"allocated_mib={allocated / 2**20:.0f} peak_mib={peak / 2**20:.0f} "
        f"nvml_max_mem_mib={(record.get('max_mem_bytes') or 0) / 2**20:.0f} "
        f"nvml_mean_util_pct={record.get('mean_util_pct')} samples={record.get('samples')} "
        f"release_check={'ok' if all(released.values()) else 'failed'} "
        f"nvml_path={'ok' if not failed else 'failed:' + ','.join(failed)}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
