"""How long a voicert child process takes to be up, spawned against started from the forkserver
(voicert.hosting.child_context): from Process.start() until the child has imported what an
engine process imports. docs/benchmarks.md section 29.

Usage: .venv/bin/python scripts/child_start_time.py [children per method, default 3]
"""

import multiprocessing as mp
import sys
import time

from voicert.hosting import child_context


def _child(queue) -> None:
    import voicert.engine.clients.remote
    import voicert.engine.core.engine_core  # noqa: F401  (what an engine process imports)

    queue.put(time.perf_counter())


def main(n: int = 3) -> None:
    for label, ctx in (("spawn", mp.get_context("spawn")), ("child_context", child_context())):
        for i in range(n):
            queue = ctx.Queue()
            t0 = time.perf_counter()
            proc = ctx.Process(target=_child, args=(queue,))
            proc.start()
            up = queue.get()
            proc.join()
            print(
                f"{label} ({ctx.get_start_method()}), child {i + 1}: {up - t0:.2f} s to imported",
                flush=True,
            )


if __name__ == "__main__":
    main(*map(int, sys.argv[1:]))
