"""server.blas_threads: the server process keeps numpy's BLAS pool to the configured size (one
thread per core spin-waits between the front end's small products and takes every core)."""

import ast
import subprocess
import sys

PROBE = """
import sys, threadpoolctl
from voicert.server.app import limit_blas_threads
limit_blas_threads(int(sys.argv[1]))
print(sorted({i["num_threads"] for i in threadpoolctl.threadpool_info()
              if i["user_api"] == "blas"}))
"""


def blas_threads_after(n: int) -> list[int]:
    out = subprocess.run([sys.executable, "-c", PROBE, str(n)], capture_output=True, text=True,
                         check=True, env={"OPENBLAS_NUM_THREADS": "2", "PATH": ""})
    return ast.literal_eval(out.stdout)


def test_the_configured_blas_threads_are_applied_and_zero_leaves_the_default():
    assert blas_threads_after(1) == [1]
    assert blas_threads_after(0) == [2]  # the library's own setting (here from the environment)
