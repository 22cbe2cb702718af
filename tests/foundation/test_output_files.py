"""Outputs are written whole or not at all, with normal permissions; bad output paths and
SIGTERM end in one clear line, the documented exit status, and nothing left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tftpu.errors import OutputError
from tftpu.ir import TopBuilder
from tftpu.utils import files


def _leftovers(d):
    return sorted(p.name for p in d.rglob("*") if p.name.startswith(".") or p.suffix == ".tmp")


def test_existing_directory_is_refused(tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(OutputError, match="is a directory"):
        files.write_text(tmp_path / "out", "x")
    assert _leftovers(tmp_path) == []


def test_parent_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(OutputError, match="not a directory"):
        files.write_bytes(tmp_path / "f" / "x.bin", b"1")


def test_a_fifo_or_device_is_never_replaced_and_a_path_must_be_one(tmp_path):
    """The rename onto an output would replace a device or fifo with a plain file: refused, the
    special file left as it was (a fifo here; /dev/full alike); a path that is None or a number
    is a UsageError, not pathlib's TypeError."""
    from tftpu.errors import UsageError

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match="not a regular file"):
        files.write_bytes(fifo, b"1")
    assert fifo.is_fifo() and _leftovers(tmp_path) == []
    for bad in (None, 5, ""):
        with pytest.raises(UsageError, match="expected a file path"):
            files.write_text(bad, "x")


def test_name_too_long_is_refused(tmp_path):
    with pytest.raises(OutputError, match="too long"):
        files.write_text(tmp_path / ("n" * 300), "x")


def test_files_get_the_permissions_of_a_plain_write(tmp_path):
    code = textwrap.dedent(f"""
        import os
        os.umask(0o027)
        from tftpu.utils import files
        files.write_text({str(tmp_path / 'a.txt')!r}, "x")
        print(oct(os.stat({str(tmp_path / 'a.txt')!r}).st_mode & 0o777))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0o640"
    files.write_text(tmp_path / "b.txt", "x")
    assert os.stat(tmp_path / "b.txt").st_mode & 0o777 == 0o666 & ~files.umask()


def test_model_save_checks_both_outputs_first(tmp_path):
    b = TopBuilder("m")
    x = b.input("x", (1, 2))
    model = b.finish([b.op("Add", [x, b.weight("w", np.ones(2, np.float32))], {}, "y")])
    (tmp_path / "m.top.mlir").mkdir()
    with pytest.raises(OutputError):
        model.save(tmp_path / "m.top.mlir")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.top.mlir"]   # no weights left behind


def test_sigterm_exits_143_and_leaves_nothing(tmp_path):
    code = textwrap.dedent(f"""
        import time
        from tftpu import cli
        from tftpu.utils import files

        def main(args):
            with files.atomic_write({str(tmp_path / 'big.bin')!r}) as f:
                f.write(b"x" * 1000)
                print("writing", flush=True)
                time.sleep(60)

        cli.run(main, "a tool that writes slowly", argv=["slow"])
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "writing"
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 143
    assert err.strip().splitlines() == ["slow: error: terminated"]
    time.sleep(0.1)
    assert list(tmp_path.iterdir()) == []
