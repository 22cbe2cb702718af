"""Quiet by default, verbose with `TFTPU_VERBOSE=1`: the one noise policy of tftpu.

TensorFlow, TFLite and Keras talk a lot on stderr: oneDNN and CPU-feature lines written by C++
before its logging is set up (so `TF_CPP_MIN_LOG_LEVEL` cannot hold them back), TFLite's
"Created TensorFlow Lite XNNPACK delegate", Python deprecation warnings (`tf.lite.Interpreter
is deprecated`), absl warnings logged by TF and Keras, Keras' export trace ("Captures: ...
TensorSpec"). A tool's stderr must be its own lines only: one line on an error.

- `tool_output()` wraps a whole tool run (`tftpu.cli.run`): native writes to file descriptor 2
  go to /dev/null, while Python's `sys.stderr` (tftpu's error line, its own absl warnings)
  keeps writing to the real stderr; warnings and log records from other packages are dropped.
- `import_tensorflow()` imports TensorFlow with its start-up lines kept off stderr.
- `native_stderr_silenced()` hides native (and Python) stderr around one noisy library call.

With `TFTPU_VERBOSE=1` (or any value but empty/0/false/no) nothing is hidden and tftpu logs at
INFO.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from pathlib import Path

_OWN = (str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2] / "tools"))


def verbose() -> bool:
    """Whether the user asked to see everything (`TFTPU_VERBOSE=1`)."""
    return os.environ.get("TFTPU_VERBOSE", "").strip().lower() not in ("", "0", "false", "no", "off")


class _OwnRecords(logging.Filter):
    """Keeps the log records tftpu itself writes (its package and tools/); drops TF's, Keras'."""

    def filter(self, record: logging.LogRecord) -> bool:
        path = os.path.abspath(record.pathname or "")
        return path.startswith(_OWN)


@contextlib.contextmanager
def native_stderr_silenced():
    """File descriptor 2 points to /dev/null inside the block (unless verbose, or stderr is not
    the process's own, e.g. captured by a test runner)."""
    if verbose():
        yield
        return
    try:
        fd = sys.__stderr__.fileno() if sys.__stderr__ is not None else -1
    except (AttributeError, OSError, ValueError):
        fd = -1
    if fd != 2:
        yield
        return
    for stream in (sys.stderr, sys.__stderr__):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def import_tensorflow():
    """`import tensorflow`, its C++ start-up lines (oneDNN, CPU features) kept off stderr unless
    verbose. An import error still raises normally."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    if not verbose():
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with native_stderr_silenced():
        import tensorflow
    return tensorflow


class _ToolFormatter(logging.Formatter):
    """`tftpu-X: warning: message`, the form of the tool's error line (absl's own form, with
    time, thread and source line, when verbose)."""

    def __init__(self, prog: str):
        super().__init__()
        self.prog = prog

    def format(self, record: logging.LogRecord) -> str:
        return f"{self.prog}: {record.levelname.lower()}: {' '.join(record.getMessage().split())}"


@contextlib.contextmanager
def tool_output(prog: str = "tftpu"):
    """The whole run of a command-line tool: quiet unless verbose (see the module doc); tftpu's
    own warnings read `prog: warning: ...`."""
    if verbose():
        yield
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")   # TF's C++ INFO/WARNING/ERROR lines
    own = _OwnRecords()
    handlers = list(logging.getLogger().handlers)
    from absl import logging as absl_logging

    absl_handler = absl_logging.get_absl_handler()
    for h in {*handlers, absl_handler}:
        h.addFilter(own)
    old_formatter = absl_handler.python_handler.formatter
    absl_handler.python_handler.setFormatter(_ToolFormatter(prog))
    real = None
    old_stderr, old_stream = sys.stderr, absl_handler.python_handler.stream
    try:
        fd = sys.stderr.fileno() if sys.stderr is sys.__stderr__ else -1
    except (AttributeError, OSError, ValueError):
        fd = -1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # TF/Keras deprecation notices; tftpu does not warn this way
        try:
            if fd == 2:
                # Python keeps the real stderr on a duplicate descriptor; native code writes to 2
                sys.stderr.flush()
                real = os.fdopen(os.dup(2), "w", buffering=1, encoding=old_stderr.encoding or "utf-8",
                                 errors="backslashreplace")
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, 2)
                os.close(null)
                sys.stderr = real
                if old_stream is old_stderr:
                    absl_handler.python_handler.stream = real
            yield
        finally:
            if real is not None:
                with contextlib.suppress(Exception):
                    real.flush()
                os.dup2(real.fileno(), 2)
                sys.stderr = old_stderr
                absl_handler.python_handler.stream = old_stream
                real.close()
            for h in {*handlers, absl_handler}:
                h.removeFilter(own)
            absl_handler.python_handler.setFormatter(old_formatter)
