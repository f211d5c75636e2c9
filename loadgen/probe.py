"""What the server and the GPU did during a load level: engine and ASR batch sizes and engine step
times from the server's ``/metrics`` (deltas over the level), GPU utilisation and memory sampled
from ``nvidia-smi`` when it exists, and, given the server's pid on this machine, the CPU cores its
processes used (the process and its descendants: workers, engine host; from ``/proc``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

HISTOGRAMS = {"engine_batch": "voicert_engine_batch_size", "asr_batch": "voicert_asr_batch_size"}
STEP = "voicert_engine_step_seconds"  # labelled by kind: prefill | decode
GC = "voicert_gc_pause_seconds"  # labelled by process (server | engine) and generation
LAG = "voicert_loop_lag_seconds"  # labelled by process (every worker's loop: server)


def metrics_url(ws_url: str) -> str:
    """ws://host:port/path -> http://host:port/metrics"""
    scheme, rest = ws_url.split("://", 1)
    host = rest.split("/", 1)[0].split("?", 1)[0]
    return f"{'https' if scheme == 'wss' else 'http'}://{host}/metrics"


BUDGET_GAUGE = "voicert_ttft_budget_seconds"


def fetch(url: str) -> str | None:
    """The server's /metrics exposition; None if unreachable."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.read().decode()
    except OSError:
        return None


def scrape_budget(url: str) -> float | None:
    """The server's TTFT budget in ms (telemetry.budget_ms) from its /metrics; None when it is
    not there to say."""
    text = fetch(url)
    if text is None:
        return None
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == BUDGET_GAUGE:
                return s.value * 1000
    return None


def scrape(url: str) -> dict[str, float]:
    """Sum and count of the batch-size histograms, and the gauges we report. {} if unreachable."""
    text = fetch(url)
    return {} if text is None else parse(text)


def parse(text: str) -> dict[str, float]:
    """The figures :func:`scrape` keeps, from a Prometheus exposition."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            for key, name in HISTOGRAMS.items():
                if s.name == f"{name}_sum":
                    out[f"{key}_sum"] = out.get(f"{key}_sum", 0.0) + s.value
                elif s.name == f"{name}_count":
                    out[f"{key}_count"] = out.get(f"{key}_count", 0.0) + s.value
            if s.name == f"{STEP}_bucket":  # cumulative count at or under upper bound "le"
                out[f"step_{s.labels['kind']}_le_{s.labels['le']}"] = s.value
            elif s.name in (f"{STEP}_sum", f"{STEP}_count"):
                out[f"step_{s.labels['kind']}_{s.name.rsplit('_', 1)[1]}"] = s.value
            for family, short in ((GC, "gc"), (LAG, "lag")):
                if s.name.startswith(family):  # per process (GC: summed over generations)
                    _add_per_process(out, short, s.name[len(family) + 1 :], s)
            if s.name == "voicert_prefix_cache_hit_ratio":
                out["prefix_hit_ratio"] = s.value
    return out


def _add_per_process(out: dict[str, float], short: str, what: str, s) -> None:
    """One sample of a histogram labelled by process, summed into ``{short}_{process}_{what}``
    (buckets: ``..._le_{bound}``)."""
    key = f"{short}_{s.labels['process']}_" + (f"le_{s.labels['le']}" if what == "bucket" else what)
    out[key] = out.get(key, 0.0) + s.value


def _delta(before: dict[str, float], after: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def _bound_holding(
    before: dict[str, float], after: dict[str, float], prefix: str, count: float
) -> float | None:
    """The smallest histogram upper bound (keys ``{prefix}{le}``) under which at least ``count``
    of the level's observations fell; None if none."""
    bounds = sorted((float(k[len(prefix) :]), k) for k in after if k.startswith(prefix))
    return next((b for b, key in bounds if _delta(before, after, key) >= count), None)


def step_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Per step kind over the level: mean step ms, and the P99 as the upper bound of the histogram
    bucket that holds it (``{kind}_step_ms_mean``, ``{kind}_step_ms_p99_le``)."""
    out: dict[str, float] = {}
    for kind in ("prefill", "decode"):
        n = _delta(before, after, f"step_{kind}_count")
        if n <= 0:
            continue
        out[f"{kind}_step_ms_mean"] = 1000 * _delta(before, after, f"step_{kind}_sum") / n
        p99 = _bound_holding(before, after, f"step_{kind}_le_", 0.99 * n)
        if p99 is not None:
            out[f"{kind}_step_ms_p99_le"] = 1000 * p99
    return out


def gc_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Per process over the level: collections, their total ms, and the longest one as the upper
    bound of its histogram bucket (``gc_{process}_count``, ``_ms_total``, ``_ms_max_le``)."""
    out: dict[str, float] = {}
    for proc in ("server", "engine"):
        n = _delta(before, after, f"gc_{proc}_count")
        if n <= 0:
            continue
        out[f"gc_{proc}_count"] = n
        out[f"gc_{proc}_ms_total"] = 1000 * _delta(before, after, f"gc_{proc}_sum")
        longest = _bound_holding(before, after, f"gc_{proc}_le_", n)
        if longest is not None:
            out[f"gc_{proc}_ms_max_le"] = 1000 * longest
    return out


def lag_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Per process label over the level (every worker's loop counts under ``server``): the event
    loop's lag P99 and largest, each as the upper bound of its histogram bucket
    (``loop_lag_{process}_ms_p99_le``, ``_ms_max_le``): how long any callback, a session's VAD
    result among them, waited for its loop."""
    out: dict[str, float] = {}
    procs = {k.split("_")[1] for k in after if k.startswith("lag_") and k.endswith("_count")}
    for proc in sorted(procs):
        n = _delta(before, after, f"lag_{proc}_count")
        if n <= 0:
            continue
        for name, share in (("p99", 0.99), ("max", 1.0)):
            bound = _bound_holding(before, after, f"lag_{proc}_le_", share * n)
            if bound is not None:
                out[f"loop_lag_{proc}_ms_{name}_le"] = 1000 * bound
    return out


@dataclass
class GpuSampler:
    """``nvidia-smi`` every ``period_ms`` on a thread: utilisation % and memory MiB of GPU 0."""

    period_ms: int = 200
    util: list[float] = field(default_factory=list)
    mem_mib: list[float] = field(default_factory=list)
    _proc: subprocess.Popen | None = None
    _thread: threading.Thread | None = None

    def start(self) -> GpuSampler:
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return self
        self._proc = subprocess.Popen(
            [
                exe,
                "--query-gpu=utilization.gpu,memory.used",
                "--format=csv,noheader,nounits",
                "-i",
                "0",
                f"-lms={self.period_ms}",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                u, m = (float(x) for x in line.split(","))
            except ValueError:
                continue
            self.util.append(u)
            self.mem_mib.append(m)

    def stop(self) -> dict[str, float]:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(5)
        if not self.util:
            return {}
        return {
            "gpu_util_mean": sum(self.util) / len(self.util),
            "gpu_util_max": max(self.util),
            "gpu_mem_max_mib": max(self.mem_mib),
            "gpu_samples": len(self.util),
        }


def tree_cpu_seconds(pid: int, proc: str = "/proc") -> float | None:
    """CPU seconds (user + system) used so far by ``pid`` and every process descended from it;
    None if ``pid`` is not running here."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(f"{proc}/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)"
        except OSError:
            continue  # gone meanwhile
        parents[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    if pid not in cpu:
        return None
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent and p not in tree]
        tree.update(children)
        frontier += children
    return sum(cpu[p] for p in tree)


@dataclass
class LevelProbe:
    """Bracket one load level: :meth:`begin` before, :meth:`end` after -> the level's figures.
    ``server_pid``: the server's process on this machine, for the CPU cores it used."""

    url: str
    server_pid: int | None = None
    _before: dict[str, float] = field(default_factory=dict)
    _gpu: GpuSampler | None = None
    _cpu0: tuple[float, float] | None = None  # (wall s, CPU s) at begin

    def begin(self) -> None:
        self._before = scrape(self.url)
        self._gpu = GpuSampler().start()
        cpu = tree_cpu_seconds(self.server_pid) if self.server_pid else None
        self._cpu0 = (time.monotonic(), cpu) if cpu is not None else None

    def end(self) -> dict[str, float]:
        after = scrape(self.url)
        out = self._gpu.stop() if self._gpu is not None else {}
        cpu = tree_cpu_seconds(self.server_pid) if self._cpu0 is not None else None
        if cpu is not None:
            out["server_cores"] = (cpu - self._cpu0[1]) / (time.monotonic() - self._cpu0[0])
        for key in HISTOGRAMS:
            n = after.get(f"{key}_count", 0.0) - self._before.get(f"{key}_count", 0.0)
            if n > 0:
                out[f"{key}_mean"] = (after[f"{key}_sum"] - self._before.get(f"{key}_sum", 0.0)) / n
                out[f"{key}_steps"] = n
        out.update(step_figures(self._before, after))
        out.update(gc_figures(self._before, after))
        out.update(lag_figures(self._before, after))
        if "prefix_hit_ratio" in after:
            out["prefix_hit_ratio"] = after["prefix_hit_ratio"]
        return out
