"""The `.tpumodel` container: sections come back as written, the same sections give the same
bytes, a failed write leaves nothing, and every damaged file (cut anywhere, any byte changed,
bytes added, a newer format, random bytes) is one ModelFileError naming the file and the part
that is wrong, never another exception and never a silent success.

The header and table layouts are restated here on purpose, so a change to the format shows up
as a failing test."""

from __future__ import annotations

import contextlib
import hashlib
import random
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tftpu.backend import model_file
from tftpu.backend.model_file import (FORMAT_VERSION, describe, parse_model_bytes, read_model_file,
                                      write_model_file)
from tftpu.errors import InternalError, ModelFileError

HEADER = struct.Struct("<8sHHIIII32sI")      # magic, major, minor, count, header length, alignment,
ENTRY = struct.Struct("<16sQQI")             # table crc, sha256, header crc / name, offset, length, crc

SMALL = {"meta": b'{"v": 1}', "empty": b"", "weights": bytes(range(7, 47))}   # a 296-byte file


def encode(sections, **kw) -> bytes:
    return b"".join(bytes(c) for c in model_file._encode(sections, **kw))


SMALL_FILE = encode(SMALL)


def forge(entries, tail=b"", *, count=None, header_len=64, align=64, version=FORMAT_VERSION, extra=b"") -> bytes:
    """A file with the given table entries and bytes after the table, every checksum right, so
    the reader has to find what is wrong from the structure alone."""
    table = b"".join(ENTRY.pack(*e) for e in entries)
    rest = extra + table + tail
    head = HEADER.pack(b"TPUMODEL", *version, len(entries) if count is None else count, header_len, align,
                       zlib.crc32(table), hashlib.sha256(rest).digest(), 0)
    return head[:60] + struct.pack("<I", zlib.crc32(head[:60])) + rest


def refused(data: bytes, *words: str) -> str:
    """The reason `data` is refused; it must contain each of `words`."""
    with pytest.raises(ModelFileError) as e:
        parse_model_bytes(data, "m.tpumodel")
    assert str(e.value).startswith("m.tpumodel: ") and e.value.path == "m.tpumodel"
    for w in words:
        assert w in e.value.reason, (w, e.value.reason)
    return e.value.reason


# -- writing and reading -------------------------------------------------------------------------

@pytest.mark.parametrize("sections", [
    {},
    {"empty": b""},
    {"a": b"", "b": b"", "c": b"x"},
    SMALL,
    {"weights": random.Random(0).randbytes(1 << 20), "meta": b"{}", "tail_0": b"\0" * 63},
    {"x" * 16: bytes(64), "z": bytes(65), "a": bytes(1)},
])
def test_round_trip(tmp_path, sections):
    path = tmp_path / "m.tpumodel"
    write_model_file(path, sections)
    back = read_model_file(path)
    assert back == sections and list(back) == list(sections)
    info = describe(path)
    assert [d["name"] for d in info] == list(sections)
    for d, data in zip(info, sections.values()):
        assert d["offset"] % 64 == 0 and d["length"] == len(data) and d["crc32"] == zlib.crc32(data)
    assert path.read_bytes() == encode(sections)


def test_layout_is_the_documented_one():
    magic, major, minor, count, header_len, align, table_crc, sha, header_crc = HEADER.unpack_from(SMALL_FILE)
    assert (magic, (major, minor), count, header_len, align) == (b"TPUMODEL", (1, 0), 3, 64, 64)
    assert header_crc == zlib.crc32(SMALL_FILE[:60])
    assert table_crc == zlib.crc32(SMALL_FILE[64:64 + 3 * 36])
    assert sha == hashlib.sha256(SMALL_FILE[64:]).digest()
    entries = [ENTRY.unpack_from(SMALL_FILE, 64 + 36 * i) for i in range(3)]
    # table ends at 172; meta at 192..200; empty at 256 (200 rounded up); weights at 256..296
    assert entries == [(b"meta".ljust(16, b"\0"), 192, 8, zlib.crc32(SMALL["meta"])),
                       (b"empty".ljust(16, b"\0"), 256, 0, 0),
                       (b"weights".ljust(16, b"\0"), 256, 40, zlib.crc32(SMALL["weights"]))]
    assert len(SMALL_FILE) == 296 and not any(SMALL_FILE[172:192]) and not any(SMALL_FILE[200:256])


def test_deterministic(tmp_path):
    sections = {"meta": b"{}", "weights": random.Random(1).randbytes(5000)}
    write_model_file(tmp_path / "a.tpumodel", sections)
    write_model_file(tmp_path / "b.tpumodel", dict(sections))
    assert (tmp_path / "a.tpumodel").read_bytes() == (tmp_path / "b.tpumodel").read_bytes()
    swapped = {"weights": sections["weights"], "meta": sections["meta"]}
    assert list(parse_model_bytes(encode(swapped))) == ["weights", "meta"]


def test_payloads_may_be_any_bytes_like(tmp_path):
    write_model_file(tmp_path / "m.tpumodel", {"a": bytearray(b"abc"), "b": memoryview(b"defg")})
    assert read_model_file(tmp_path / "m.tpumodel") == {"a": b"abc", "b": b"defg"}


@pytest.mark.parametrize("sections", [
    {"": b""}, {"Weights": b""}, {"a-b": b""}, {"x" * 17: b""}, {"é": b""}, {"a b": b""}, {"a\n": b""},
    {1: b""}, {"a": "text"}, {"a": [1, 2]}, [("a", b"")],
])
def test_bad_sections_are_caller_bugs(tmp_path, sections):
    with pytest.raises(InternalError, match="model_file"):
        write_model_file(tmp_path / "m.tpumodel", sections)
    assert list(tmp_path.iterdir()) == []


class _Exploding:
    """A file that fails after `budget` bytes, like a disk filling up mid-write."""

    def __init__(self, f, budget):
        self.f, self.budget = f, budget

    def write(self, b):
        n = len(memoryview(b).cast("B"))
        if n > self.budget:
            self.f.write(bytes(memoryview(b).cast("B")[:self.budget]))
            raise RuntimeError("disk on fire")
        self.budget -= n
        return self.f.write(b)

    def __getattr__(self, name):
        return getattr(self.f, name)


@pytest.mark.parametrize("budget", [0, 30, 100, 200, 5000])
def test_failed_write_leaves_nothing(tmp_path, monkeypatch, budget):
    real = model_file.atomic_write

    @contextlib.contextmanager
    def exploding(path, mode):
        with real(path, mode) as f:
            yield _Exploding(f, budget)

    monkeypatch.setattr(model_file, "atomic_write", exploding)
    sections = {"meta": b"{}", "weights": bytes(10_000)}
    with pytest.raises(RuntimeError, match="disk on fire"):
        write_model_file(tmp_path / "m.tpumodel", sections)
    assert list(tmp_path.iterdir()) == []
    # a failed rewrite keeps the old file whole
    monkeypatch.setattr(model_file, "atomic_write", real)
    write_model_file(tmp_path / "m.tpumodel", SMALL)
    monkeypatch.setattr(model_file, "atomic_write", exploding)
    with pytest.raises(RuntimeError):
        write_model_file(tmp_path / "m.tpumodel", sections)
    assert [p.name for p in tmp_path.iterdir()] == ["m.tpumodel"]
    assert read_model_file(tmp_path / "m.tpumodel") == SMALL


# -- files that cannot be read -------------------------------------------------------------------

def test_missing_file_and_directory(tmp_path):
    for path, reason in [(tmp_path / "no.tpumodel", "no such file"), (tmp_path, "is a directory")]:
        for read in (read_model_file, describe):
            with pytest.raises(ModelFileError, match=reason) as e:
                read(path)
            assert e.value.path == str(path) and str(e.value).startswith(f"{path}: ")


def test_errors_name_the_file(tmp_path):
    path = tmp_path / "cut.tpumodel"
    path.write_bytes(SMALL_FILE[:250])
    for read in (read_model_file, describe):
        with pytest.raises(ModelFileError) as e:
            read(path)
        assert e.value.path == str(path) and str(e.value) == f"{path}: {e.value.reason}"
        assert e.value.reason == "truncated: section 'empty' needs bytes 256..256, the file has 250"


def test_wrong_magic():
    assert refused(b"", "empty file") == "empty file, not a tpumodel"
    refused(b"PK\x03\x04" + SMALL_FILE[4:], "not a tpumodel file", "PK\\x03\\x04")
    refused(b"tpumodel" + SMALL_FILE[8:], "not a tpumodel file")
    refused(b"TPU", "truncated header")          # a prefix of the magic is a cut file
    refused(b"TPx", "not a tpumodel file")
    refused(b"\x89HDF\r\n\x1a\n" * 40, "not a tpumodel file")


def test_newer_major_refused_with_both_versions():
    for major, minor in [(2, 0), (2, 7), (65535, 65535)]:
        newer = encode(SMALL, version=(major, minor))
        refused(newer, f"format version {major}.{minor}", "(1.0)", "newer")
        refused(newer[:12], f"format version {major}.{minor}")   # told even when all else is cut
        refused(newer[:12] + b"\xff" * 7, "newer")
    refused(encode(SMALL, version=(0, 9)), "unknown format version 0.9", "1.0")


def test_newer_minor_is_read():
    assert parse_model_bytes(encode(SMALL, version=(1, 1))) == SMALL
    # a later minor may append header fields: older readers skip them, and the SHA-256 still covers them
    extended = encode(SMALL, version=(1, 3), header_extra=b"new fields here!")
    assert parse_model_bytes(extended) == SMALL
    damaged = bytearray(extended)
    damaged[70] ^= 1
    refused(bytes(damaged), "SHA-256")
    refused(extended[:70], "truncated header", "needs 80")
    # the same extension in a 1.0 file is malformed
    refused(encode(SMALL, version=(1, 0), header_extra=bytes(16)), "malformed header", "header length 80")


def test_trailing_bytes_refused():
    refused(SMALL_FILE + b"\0", "trailing garbage: 1 bytes", "byte 296")
    refused(SMALL_FILE + SMALL_FILE, "trailing garbage: 296 bytes")
    refused(encode({}) + b"x", "trailing garbage", "byte 64")


def test_truncation_at_every_boundary():
    sections = {"meta": b"{}", "code": bytes(range(200)), "empty": b"", "weights": bytes(5000)}
    data = encode(sections)
    info = [(name, off, off + n) for name, off, n, _ in model_file._entries(data, "x")]
    table_end = 64 + 36 * len(sections)
    expected = {0: "empty file"}
    for cut in (1, 7, 8, 11):
        expected[cut] = "truncated header"
    expected[12] = expected[40] = expected[63] = "truncated header: the file has"
    for cut in (64, 65, 100, table_end - 1):
        expected[cut] = f"truncated: the section table (4 sections) needs bytes 64..{table_end}, the file has {cut}"
    prev_end = table_end
    for name, start, end in info:
        for cut in {prev_end, prev_end + 1, start - 1, start, start + 1, start + 3, end - 1} - {end}:
            if prev_end <= cut < end:
                expected[cut] = f"truncated: section {name!r} needs bytes {start}..{end}, the file has {cut}"
        prev_end = end
    assert len(data) == prev_end
    for cut, reason in sorted(expected.items()):
        assert refused(data[:cut]).startswith(reason), (cut, reason)


def test_every_truncation_refused():
    for cut in range(len(SMALL_FILE)):
        refused(SMALL_FILE[:cut])


# -- damaged files -------------------------------------------------------------------------------

def _part(pos: int) -> str:
    """The words the reason must hold for a change at byte `pos` of SMALL_FILE."""
    if pos < 8:
        return "not a tpumodel"
    if pos < 10:
        return "format version"                  # the major: newer (refused) or 0 (unknown)
    if pos < 64:
        return "header checksum mismatch"        # minor, count, lengths, CRCs and SHA-256 alike
    if pos < 172:
        return "section table checksum mismatch"
    if 192 <= pos < 200:
        return "section 'meta'"
    if 256 <= pos < 296:
        return "section 'weights'"
    return "corrupt padding before section"


def test_every_byte_change_is_refused():
    for pos in range(len(SMALL_FILE)):
        words = _part(pos)
        for value in range(256):
            if value == SMALL_FILE[pos]:
                continue
            data = bytearray(SMALL_FILE)
            data[pos] = value
            try:
                parse_model_bytes(bytes(data), "m.tpumodel")
            except ModelFileError as e:
                assert words in e.reason and e.path == "m.tpumodel", (pos, value, e.reason)
            else:
                raise AssertionError(f"byte {pos} set to {value} was accepted")


def test_damage_names_its_part():
    data = bytearray(SMALL_FILE)
    data[260] ^= 0x10
    assert refused(bytes(data)) == "checksum mismatch in section 'weights' (bytes 256..296)"
    data = bytearray(SMALL_FILE)
    data[100] ^= 1
    assert refused(bytes(data)) == "section table checksum mismatch (bytes 64..172 are corrupt)"
    data = bytearray(SMALL_FILE)
    data[210] = 7
    assert refused(bytes(data)) == "corrupt padding before section 'empty' (bytes 200..256 are not zero)"


def _entry(name, offset, data):
    return (name.ljust(16, b"\0") if isinstance(name, bytes) else name.encode().ljust(16, b"\0"),
            offset, len(data), zlib.crc32(data))


def test_malformed_tables_with_right_checksums():
    """Files no writer of this format makes, checksums and all: the structure must be checked."""
    one = 64 + 36
    assert parse_model_bytes(forge([_entry("a", 128, b"xy")], bytes(28) + b"xy")) == {"a": b"xy"}
    # where the payloads sit
    refused(forge([_entry("a", 192, b"xy")], bytes(92) + b"xy"), "'a' at offset 192, expected 128")
    refused(forge([_entry("a", 64, b"xy")], b"xy"), "'a' at offset 64 overlaps", "ends at 100")
    refused(forge([_entry("a", 192, bytes(100)), _entry("b", 256, b"z")], bytes(56) + bytes(100) + b"z"),
            "'b' at offset 256 overlaps", "ends at 292")
    refused(forge([_entry("a", 192, b"z"), _entry("b", 128, b"z")], bytes(56) + b"z"), "'b' at offset 128 overlaps")
    # names
    for raw in [b"", b"Bad", b"a\0b", b"\xff" * 16, b"a b", b"\0a"]:
        refused(forge([_entry(raw, 128, b"")], bytes(28)), "malformed section table", "entry 0")
    refused(forge([_entry("a", 192, b""), _entry("a", 192, b"")], bytes(56)), "'a' appears twice")
    # counts and lengths that would take memory or time if believed
    refused(forge([], count=2**32 - 1), f"{2**32 - 1} sections, more than the 1024")
    refused(forge([], count=1024), "truncated: the section table (1024 sections) needs bytes 64..36928")
    refused(forge([(b"w".ljust(16, b"\0"), 128, 2**64 - 1, 0)], bytes(28)),
            f"truncated: section 'w' needs bytes 128..{128 + 2**64 - 1}, the file has {one + 28}")
    # header fields
    refused(forge([], header_len=63), "malformed header: header length 63")
    refused(forge([], header_len=2**32 - 1, version=(1, 9)), "malformed header: header length 4294967295")
    for align in (0, 3, 96, 2**31):
        refused(forge([], align=align), f"alignment {align} is not a power of two")
    assert parse_model_bytes(forge([_entry("a", 4096, b"x")], bytes(4096 - one) + b"x", align=4096)) == {"a": b"x"}


def test_sha256_catches_what_the_crcs_miss():
    data = bytearray(SMALL_FILE)
    data[256:296] = bytes(40)                                          # weights zeroed ...
    struct.pack_into("<I", data, 64 + 36 * 2 + 32, zlib.crc32(bytes(40)))  # ... with a CRC to match
    struct.pack_into("<I", data, 24, zlib.crc32(data[64:172]))
    struct.pack_into("<I", data, 60, zlib.crc32(data[:60]))
    refused(bytes(data), "SHA-256 differs")


# -- fuzzing -------------------------------------------------------------------------------------

names = st.text("abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=16)
sections_st = st.dictionaries(names, st.binary(max_size=300), max_size=6)
positions = st.integers(0, 10**6)
mutation = st.one_of(
    st.tuples(st.just("set"), positions, st.integers(0, 255)),
    st.tuples(st.just("xor"), positions, st.integers(1, 255)),
    st.tuples(st.just("insert"), positions, st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), positions, st.integers(1, 80)),
    st.tuples(st.just("cut"), positions, st.just(0)),
    st.tuples(st.just("append"), positions, st.binary(min_size=1, max_size=80)),
)


def mutate(data: bytes, ops) -> bytes:
    data = bytearray(data)
    for kind, pos, arg in ops:
        pos %= len(data) + 1
        if kind in ("set", "xor") and pos < len(data):
            data[pos] = arg if kind == "set" else data[pos] ^ arg
        elif kind == "insert":
            data[pos:pos] = arg
        elif kind == "delete":
            del data[pos:pos + arg]
        elif kind == "cut":
            del data[pos:]
        elif kind == "append":
            data += arg
    return bytes(data)


@settings(max_examples=150, deadline=None)
@given(sections_st)
def test_fuzz_round_trip(sections):
    data = encode(sections)
    assert parse_model_bytes(data) == sections
    assert encode(sections) == data


@settings(max_examples=300, deadline=None)
@given(sections_st, st.lists(mutation, min_size=1, max_size=4))
def test_fuzz_mutations_only_model_file_error(sections, ops):
    original = encode(sections)
    data = mutate(original, ops)
    try:
        back = parse_model_bytes(data, "fuzz.tpumodel")
    except ModelFileError as e:
        assert str(e).startswith("fuzz.tpumodel: ")
    else:
        assert data == original and back == sections


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([b"", b"TPUMODEL", b"TPUMODEL\x01\x00\x00\x00", b"TPUMODEL\x01\x00\x05\x00\x02\x00\x00\x00"]),
       st.binary(max_size=400))
def test_fuzz_random_bytes_only_model_file_error(prefix, rest):
    with pytest.raises(ModelFileError) as e:
        parse_model_bytes(prefix + rest, "fuzz.tpumodel")
    assert str(e.value).startswith("fuzz.tpumodel: ")
