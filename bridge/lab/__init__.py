"""The one-host lab cluster: real Slurm (several slurmd, fake GPU gres, slurmdbd on
MariaDB, partition preemption) and Triton as a Slurm job, under one lab directory.

`stb lab up | down | status | demo` and the test suite's session fixture use it."""
