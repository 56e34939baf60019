"""The protocol's constants are written once in Python (Triton's ports in
`bridge.triton.ports`, the job tag in `bridge.slurm.model`); the files that cannot import
them (the job script, job_submit.lua) must say the same, and no Python module spells them
out again."""

from __future__ import annotations

import re

from bridge.paths import project_root
from bridge.slurm.model import BRIDGE_TAG, TRITON_TAG
from bridge.triton.ports import GRPC_PORT, HTTP_PORT, METRICS_PORT

ROOT = project_root()
SBATCH = ROOT / "deploy" / "slurm" / "triton-server.sbatch"


def test_the_job_script_starts_triton_on_the_ports_and_with_the_tag() -> None:
    text = SBATCH.read_text()
    assert re.search(rf"^port=\$\{{STB_TRITON_PORT:-{HTTP_PORT}\}}$", text, re.M)
    ports = dict(re.findall(r'--(http|grpc|metrics)-port="\$\(*(port(?: \+ \d)?)\)*"', text))
    assert ports == {
        "http": "port",
        "grpc": f"port + {GRPC_PORT - HTTP_PORT}",
        "metrics": f"port + {METRICS_PORT - HTTP_PORT}",
    }
    assert f"#SBATCH --comment={TRITON_TAG}" in text.splitlines()


def test_job_submit_lua_tags_with_the_bridges_prefix() -> None:
    lua = (ROOT / "slurm_plugins" / "job_submit.lua").read_text()
    assert re.search(rf'local TAG = "{re.escape(BRIDGE_TAG)}workload="', lua)


def test_no_python_module_spells_the_constants_out_again() -> None:
    again = []
    for path in [*ROOT.glob("bridge/**/*.py"), *ROOT.glob("accounting/**/*.py")]:
        if path.name == "ports.py" and path.parent.name == "triton":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"""=\s*800[012]\b|[=(,\[]\s*["']stb:triton["']""", code):
                if path.name == "model.py" and "TRITON_TAG =" in code:
                    continue
                again.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert again == [], "\n".join(again)
