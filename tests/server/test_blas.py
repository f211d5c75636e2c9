"""server.blas_threads: the server process keeps numpy's BLAS pool to the configured size (one
thread per core spin-waits between the front end's small products and takes every core)."""

import ast
import subprocess
import sys

PROBE = """
import numpy  # loaded, as in every server process
import threadpoolctl
from voicert.hosting import limit_blas_threads

def blas():
    return sorted({i["num_threads"] for i in threadpoolctl.threadpool_info()
                   if i["user_api"] == "blas"})

limit_blas_threads(0)
after_zero = blas()
limit_blas_threads(1)
print([after_zero, blas()])
"""


def test_the_configured_blas_threads_are_applied_and_zero_leaves_the_default():
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        check=True,
        env={"OPENBLAS_NUM_THREADS": "2", "PATH": ""},
    )
    after_zero, after_one = ast.literal_eval(out.stdout)
    assert after_zero == [2]  # the library's own setting (here from the environment)
    assert after_one == [1]
