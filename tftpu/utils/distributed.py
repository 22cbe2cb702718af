"""Calibration and evaluation on several worker processes, over `tf.distribute`.

The engine is TensorFlow's own: `tf.distribute.MultiWorkerMirroredStrategy`, configured by the
`TF_CONFIG` environment variable, as the training jobs this package serves already run (a
Kubernetes TFJob, Vertex AI or SageMaker sets `TF_CONFIG` on every machine). Its collectives carry
the merge: a ring all-reduce sums the calibration histograms (int64, so exactly) and an all-gather
collects per-image evaluation figures; every worker ends with the same result, and the chief
(worker 0) writes the outputs.

Why not Apache Beam or Ray (checked 2026-11 against `constraints.txt`): Beam 2.73-2.77 require
pillow < 13 where the stack pins 13.0, and pip finds no older Beam that installs beside TF 2.21;
Ray 2.60 installs, but would add a second cluster manager (GCS, raylets, a dashboard) to machines
that already run tf.distribute jobs. tf.distribute needs nothing installed, and the statistics
are built to merge exactly (`TensorStatistics.merge`), which is all a collective needs.

Two ways to run:

- `workers=N` (`--workers=N`): this machine starts N worker processes itself
  (`python -m tftpu.utils.distributed`), each with a `TF_CONFIG` of N workers on loopback ports,
  and stops them when done or when one fails (its error is raised here, as its own type). A model
  in memory goes to them as its model file in the caller's private temporary directory (never a
  pickle), the dataset as its path (a directory, a glob, TFRecords): each worker
  reads the dataset itself, taking every N-th sample (`Samples.shard`). A worker imports
  TensorFlow without the Keras (and matplotlib) it would load eagerly, and gets
  cores / N threads (TensorFlow's, the INT8 kernels', BLAS's), so N workers do not
  oversubscribe the machine's cores.
- `cluster=Cluster.from_tf_config()` (`--tf_config`): this process is one worker of the cluster
  `TF_CONFIG` describes; run the same command on every machine. The strategy must be made before
  any other TensorFlow op runs in the process.

`workers=1` (the default) runs in this process, with no set-up and no TensorFlow cluster.

>>> table = tftpu.quant.calibrate(model, iter_samples(model, "calib/"), workers=2)   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from tftpu import errors
from tftpu.utils import threads as _threads
from tftpu.utils.files import write_text

__all__ = ["Cluster", "LOCAL", "launch", "check_workers", "LAST_RUN", "mark"]

_JOB_PREFIX = "tftpu."
# The chief's timings of the last `launch` in this process (for benchmarks): "startup_s" from its
# process start to the cluster being ready (Python, TensorFlow, the strategy), "job_s" the job itself,
# "phases" [name, seconds] from the process start, each phase ending at a `mark` (python, tensorflow,
# cluster, then the job's own: model, statistics, merge, ...).
LAST_RUN: dict = {}
_MARKS: list = []                   # (phase name, time.time() at its end) in a worker
_RECORDING = False                  # whether `mark` records (in a `launch` worker only)
# the modules `import tensorflow` loads eagerly to register Keras' optimizers, and with them all of
# Keras and matplotlib (1.3 s of a worker's start); a calibration or evaluation worker uses neither
_EAGER_KERAS = ("keras.src.optimizers", "tf_keras.src.optimizers")


class Cluster:
    """This process's place among the workers (`rank` of `size`) and the collectives between
    them. `LOCAL` is the one-process cluster: its collectives return their input."""

    def __init__(self, strategy=None, rank: int = 0, size: int = 1):
        self.strategy, self.rank, self.size = strategy, rank, size

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_tf_config(cls, threads: int | None = None) -> "Cluster":
        """Join the cluster of `TF_CONFIG` (a MultiWorkerMirroredStrategy, CPU collectives),
        with `threads` TensorFlow threads per op when given."""
        raw = os.environ.get("TF_CONFIG")
        if not raw:
            raise errors.UsageError("TF_CONFIG is not set: it names the cluster's workers and this one's index "
                                    "(see tf.distribute.MultiWorkerMirroredStrategy)")
        try:
            config = json.loads(raw)
            cluster, task = config["cluster"], config["task"]
            kind, index = task["type"], int(task["index"])
            chiefs, workers = list(cluster.get("chief", [])), list(cluster.get("worker", []))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise errors.UsageError(f"TF_CONFIG is not a tf.distribute cluster spec ({type(e).__name__}: {e})") \
                from None
        if kind not in ("chief", "worker") or not 0 <= index < len(chiefs if kind == "chief" else workers):
            raise errors.UsageError(f"TF_CONFIG: task {kind} {index} is not one of the cluster's chief or workers")
        import tensorflow as tf
        if threads:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=tf.distribute.experimental.CommunicationImplementation.RING))
        size = len(chiefs) + len(workers)
        if strategy.num_replicas_in_sync != size:
            raise errors.UsageError(f"TF_CONFIG: {size} tasks, but the strategy has {strategy.num_replicas_in_sync} "
                                    f"replicas (one CPU device per worker expected)")
        return cls(strategy, 0 if kind == "chief" else index + len(chiefs), size)

    # -- collectives (every worker calls each, in the same order) ------------------------------
    def all_sum(self, array: np.ndarray) -> np.ndarray:
        """The element-wise sum of every worker's int64 `array` (same shape on all): exact."""
        array = np.ascontiguousarray(array, np.int64)
        if self.size == 1:
            return array
        import tensorflow as tf
        s = self.strategy
        return s.reduce(tf.distribute.ReduceOp.SUM, s.run(lambda: tf.constant(array)), axis=None).numpy()

    def _gather_rows(self, rows: np.ndarray) -> np.ndarray:
        import tensorflow as tf
        s = self.strategy
        return s.gather(s.run(lambda: tf.constant(rows)), axis=0).numpy()

    def gather_bytes(self, data: bytes) -> list[bytes]:
        """Every worker's `data`, in rank order (an all-gather: every worker gets all)."""
        if self.size == 1:
            return [bytes(data)]
        lengths = self._gather_rows(np.array([len(data)], np.int64))
        words = np.frombuffer(bytes(data) + b"\0" * (-len(data) % 8), "<i8")
        flat = self._gather_rows(words.astype(np.int64)).astype("<i8").tobytes()
        out, at = [], 0
        for n in lengths.tolist():
            out.append(flat[at:at + n])
            at += n + (-n % 8)
        return out

    def gather_json(self, value) -> list:
        """Every worker's JSON-able `value`, in rank order (floats exactly: shortest repr; inf/nan kept)."""
        return [json.loads(b) for b in self.gather_bytes(json.dumps(value).encode())]

    def broadcast_json(self, value) -> Any:
        """The chief's `value`, on every worker (others pass anything, e.g. None)."""
        return self.gather_json(value if self.is_chief else None)[0]


LOCAL = Cluster()
WORKERS_PER_CORE = 4


def max_workers() -> int:
    """The most local worker processes `launch` starts: WORKERS_PER_CORE for each CPU core (each
    holds its own TensorFlow and model; more only share the same cores and memory)."""
    return WORKERS_PER_CORE * (os.cpu_count() or 1)


def check_workers(workers, cluster) -> None:
    """A UsageError unless `workers` is a count from 1 to `max_workers()` and at most one of
    workers > 1 / `cluster` is given."""
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise errors.UsageError(f"workers {workers!r}: give a count >= 1")
    if workers > max_workers():
        raise errors.UsageError(f"workers {workers}: at most {max_workers()} on this machine ({WORKERS_PER_CORE} per "
                                f"CPU core: each is a process with its own TensorFlow and model); for more, a "
                                "cluster (TF_CONFIG) spreads them over machines")
    if workers > 1 and cluster is not None:
        raise errors.UsageError("give workers=N (local worker processes) or cluster= (TF_CONFIG), not both")
    if cluster is not None and not isinstance(cluster, Cluster):
        raise errors.UsageError(f"cluster {cluster!r}: expected a tftpu.utils.distributed.Cluster "
                                "(Cluster.from_tf_config())")


def mark(phase: str) -> None:
    """End the current phase (`phase` its name) of a `launch` worker: the chief reports them in
    LAST_RUN. Elsewhere it does nothing."""
    if _RECORDING:
        _MARKS.append((phase, time.time()))


def _import_tensorflow() -> None:
    """`import tensorflow` without the Keras it loads eagerly (`_EAGER_KERAS`); `import keras`
    still works afterwards, for a job that wants it."""
    if "tensorflow" in sys.modules:
        return
    blocked = [name for name in _EAGER_KERAS if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None        # `import_module` raises ImportError, which TensorFlow passes over
    try:
        import tensorflow  # noqa: F401
    finally:
        for name in blocked:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]


def default_threads(workers: int) -> int:
    """TensorFlow threads per local worker: the cores this process may run on, shared out, at
    least one."""
    return max(1, _threads.cores() // workers)


def _free_ports(count: int) -> list[int]:
    """`count` loopback ports free now (held open together, so they differ)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def _error(record: dict) -> Exception:
    """The exception a worker reported, as its own tftpu type where it has one."""
    cls = getattr(errors, record.get("type", ""), None)
    message = record.get("message", "")
    if not (isinstance(cls, type) and issubclass(cls, (errors.TftpuError, errors.InternalError))):
        return errors.InternalError(f"a worker failed: {record.get('type')}: {message}")
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    return err


def launch(job: str, args: dict, workers: int, threads: int | None = None) -> Any:
    """Run `job` ("tftpu.module:function", called as `function(cluster, **args)`) on `workers`
    local processes joined by tf.distribute on loopback, and return the chief's result (JSON).
    Each worker gets `threads` TensorFlow threads (intra- and inter-op), by default this
    machine's cores / `workers` (`default_threads`), so the workers do not fight over the cores.
    TensorFlow's pools, the INT8 kernels' own (`tftpu.utils.threads`, exact on any count) and
    numpy's BLAS (`tftpu.utils.threads.BLAS_ENV`: where left wide, its idle threads spin and
    eat the other workers' cores) are sized. Figures stay the same bits as one process's, since
    `tftpu.interp.similarity` sums without BLAS. An argument that names a file `hand_over`
    wrote is read back by the job's `take_over`."""
    if not job.startswith(_JOB_PREFIX) or ":" not in job:
        raise errors.InternalError(f"launch: job {job!r} is not a tftpu function")
    threads = threads or default_threads(workers)
    ports = _free_ports(workers)
    with tempfile.TemporaryDirectory(prefix="tftpu_workers_") as tmp:
        tmp = Path(tmp)
        spec = tmp / "job.json"
        spec.write_text(json.dumps({"job": job, "args": args, "result": str(tmp / "result.json")}))
        sized = {name: str(threads) for name in (_threads.ENV, *_threads.BLAS_ENV)}
        base = {**os.environ, **sized, "TF_CPP_MIN_LOG_LEVEL": "2", "TFTPU_PROGRESS": "0"}
        base.pop("TF_CONFIG", None)
        procs, logs = [], []
        try:
            for i in range(workers):
                config = {"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]}, "task": {"type": "worker", "index": i}}
                log = open(tmp / f"worker{i}.log", "wb")
                logs.append(log)
                procs.append(subprocess.Popen([sys.executable, "-m", "tftpu.utils.distributed", str(spec), str(i)],
                                              env={**base, "TF_CONFIG": json.dumps(config)}, stdin=subprocess.DEVNULL,
                                              stdout=log, stderr=subprocess.STDOUT))
            failed = _wait(procs)
            if failed is not None:
                report = tmp / f"error{failed}.json"
                if report.is_file():
                    raise _error(json.loads(report.read_text()))
                tail = (tmp / f"worker{failed}.log").read_text(errors="replace").strip().splitlines()[-3:]
                raise errors.InternalError(f"worker {failed} of {workers} exited with status "
                                           f"{procs[failed].returncode}: {' | '.join(tail)}")
            out = json.loads((tmp / "result.json").read_text())
            LAST_RUN.clear()
            LAST_RUN.update(out["timing"])
            return out["result"]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for log in logs:
                log.close()


def _wait(procs: list) -> int | None:
    """Wait for every worker; the index of the first that fails (the others then stop), or None."""
    while True:
        codes = [p.poll() for p in procs]
        bad = [i for i, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            return bad[0]
        if all(c == 0 for c in codes):
            return None
        time.sleep(0.05)


def worker_main(argv: list[str]) -> int:
    """One worker process of `launch`: join the cluster, run the job, the chief writes its result."""
    spec_path, index = Path(argv[1]), argv[2]
    spec = json.loads(spec_path.read_text())
    global _RECORDING
    _RECORDING = True
    mark("python")
    try:
        threads = int(os.environ.get(_threads.ENV, "0")) or None
        _import_tensorflow()
        mark("tensorflow")
        cluster = Cluster.from_tf_config(threads)
        mark("cluster")
        ready = time.perf_counter()
        module, name = spec["job"].split(":")
        if not module.startswith(_JOB_PREFIX):
            raise errors.InternalError(f"job {spec['job']!r} is not a tftpu function")
        result = getattr(importlib.import_module(module), name)(cluster, **spec["args"])
        mark("rest of the job")
        if cluster.is_chief:
            start = _process_start()
            job_s = time.perf_counter() - ready
            ends = [(name, t - start) for name, t in _MARKS]
            phases = [[name, round(end - (ends[k - 1][1] if k else 0.0), 3)] for k, (name, end) in enumerate(ends)]
            timing = {"startup_s": time.time() - start - job_s, "job_s": job_s, "phases": phases}
            write_text(spec["result"], json.dumps({"result": result, "timing": timing}))
        return 0
    except (errors.TftpuError, errors.InternalError) as e:
        write_text(spec_path.parent / f"error{index}.json", json.dumps({"type": type(e).__name__, "message": str(e)}))
        return e.exit_code


def _process_start() -> float:
    """This process's start, in time.time() seconds (from /proc; now where it cannot be read)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


if __name__ == "__main__":
    # run as the imported module, not as __main__: the job's `mark` calls reach the same `_MARKS`
    from tftpu.utils import distributed as _module
    sys.exit(_module.worker_main(sys.argv))
