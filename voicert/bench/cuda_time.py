"""GPU time of a call as a served engine pays it: captured in a CUDA graph (host overhead excluded)
and replayed between CUDA events. Shared by the benches that time kernels."""

from __future__ import annotations

from collections.abc import Callable

import torch


def graph_times(fn: Callable[[], object], calls: int, replays: int) -> list[float]:
    """GPU microseconds per call of ``fn``, one figure per replay of a CUDA graph of ``calls``
    calls (after eager warm-up calls, which also compile any JIT kernels)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    return times
