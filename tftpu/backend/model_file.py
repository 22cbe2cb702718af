"""The `.tpumodel` container: the compiled model file of the NPU backend as named sections of
bytes, checked on every read.

The container knows only names and bytes; what goes inside a section is its writer's business.
Payloads start on 64-byte boundaries so a weights blob can be memory-mapped aligned. The same
sections always give the same bytes (no timestamps), and a file is written whole or not at all.
Every way a file can be wrong (missing, not a tpumodel, a newer format, truncated, a flipped
byte, trailing bytes) is one `ModelFileError` naming the file and where: the header, the section
table and each section carry their own CRC-32, so a single changed byte always names its part,
and a SHA-256 covers everything after the header.

Layout, little-endian:

    ======  ====  ==========================================================================
    offset  size  field
    ======  ====  ==========================================================================
         0     8  magic b"TPUMODEL"
         8     2  format major (u16): a reader refuses a newer major
        10     2  format minor (u16): a newer minor with the same major is still read
        12     4  section count (u32)
        16     4  header length (u32): bytes before the section table; 64 in 1.0 (a newer
                  minor may append header fields, which older readers skip)
        20     4  alignment (u32): payload offsets are multiples of it; 64
        24     4  CRC-32 of the section table
        28    32  SHA-256 of every byte after the first 64 (table, payloads, padding)
        60     4  CRC-32 of header bytes 0..60
        64   36n  section table, one 36-byte entry per section, in file order:
                  name (16 bytes, ASCII [a-z0-9_], zero padded), offset (u64), length (u64),
                  CRC-32 of the payload (u32)
      ...         payloads in table order, each at the end of the one before (or of the table)
                  rounded up to the alignment; zero bytes in between; the file ends where the
                  last payload ends
    ======  ====  ==========================================================================

>>> write_model_file("net.tpumodel", {"meta": b"{}", "weights": blob})   # doctest: +SKIP
>>> read_model_file("net.tpumodel")["weights"] == blob                    # doctest: +SKIP
True
"""

from __future__ import annotations

import hashlib
import re
import struct
import zlib
from pathlib import Path

from tftpu.errors import InternalError, ModelFileError
from tftpu.utils.files import atomic_write

__all__ = ["FORMAT_VERSION", "MAGIC", "write_model_file", "read_model_file", "parse_model_bytes", "describe"]

FORMAT_VERSION = (1, 0)
MAGIC = b"TPUMODEL"
ALIGNMENT = 64
MAX_SECTIONS = 1024                 # far above any real file; a larger count is corruption
MAX_HEADER = 4096                   # room for header fields of later minors

_HEADER = struct.Struct("<8sHHIIII32sI")
_ENTRY = struct.Struct("<16sQQI")
_NAME = re.compile(r"[a-z0-9_]{1,16}")
_NAME_BYTES = re.compile(rb"[a-z0-9_]{1,16}")
_CRC_AT = _HEADER.size - 4          # the header CRC covers the bytes before it
assert _HEADER.size == 64 and _ENTRY.size == 36


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def _layout(sizes: list[int], table_end: int, align: int) -> list[int]:
    """Payload offsets: each at the end of the one before (the first at the table's end),
    rounded up to `align`."""
    offsets, end = [], table_end
    for n in sizes:
        offsets.append(_align(end, align))
        end = offsets[-1] + n
    return offsets


def _encode(sections: dict, version: tuple[int, int] = FORMAT_VERSION, header_extra: bytes = b"") -> list:
    """The file as a list of byte strings to write in order (payloads are not copied).
    `version` and `header_extra` exist to write files of later minors in tests."""
    where = "model_file.write_model_file"
    if not isinstance(sections, dict):
        raise InternalError(where, f"sections must be a dict of name -> bytes, not {type(sections).__name__}")
    if len(sections) > MAX_SECTIONS:
        raise InternalError(where, f"{len(sections)} sections; the format holds at most {MAX_SECTIONS}")
    payloads = []
    for name, data in sections.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InternalError(where, f"section name {name!r} is not 1 to 16 characters of [a-z0-9_]")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InternalError(where, f"section {name!r} holds {type(data).__name__}, not bytes")
        payloads.append(memoryview(data).cast("B"))
    header_len = _HEADER.size + len(header_extra)
    table_end = header_len + _ENTRY.size * len(payloads)
    offsets = _layout([len(p) for p in payloads], table_end, ALIGNMENT)
    table = b"".join(_ENTRY.pack(name.encode("ascii"), off, len(p), zlib.crc32(p))
                     for name, off, p in zip(sections, offsets, payloads))
    chunks, end = [table], table_end
    for off, p in zip(offsets, payloads):
        chunks += [bytes(off - end), p]
        end = off + len(p)
    digest = hashlib.sha256(header_extra)
    for c in chunks:
        digest.update(c)
    head = _HEADER.pack(MAGIC, *version, len(payloads), header_len, ALIGNMENT, zlib.crc32(table),
                        digest.digest(), 0)
    head = head[:_CRC_AT] + struct.pack("<I", zlib.crc32(head[:_CRC_AT]))
    return [head, header_extra, *chunks]


def write_model_file(path, sections: dict[str, bytes]) -> None:
    """Write `sections` (name -> bytes, in the order given) to `path` as a `.tpumodel`, atomically.
    A bad name (not 1 to 16 of [a-z0-9_]) or a payload that is not bytes is an InternalError:
    the names are fixed by the caller."""
    chunks = _encode(sections)
    with atomic_write(path, "wb") as f:
        for c in chunks:
            f.write(c)


def _entries(data, where: str) -> list[tuple[str, int, int, int]]:
    """(name, offset, length, crc32) of each section of the file `data`, after checking all of it;
    raises ModelFileError naming `where` and the first thing wrong."""
    def fail(reason: str):
        raise ModelFileError(where, reason)

    data = memoryview(data).cast("B")
    size = len(data)
    if size == 0:
        fail("empty file, not a tpumodel")
    if bytes(data[:len(MAGIC)]) != MAGIC[:size]:
        fail(f"not a tpumodel file (starts with {bytes(data[:len(MAGIC)])!r}, not {MAGIC!r})")
    if size < 12:
        fail(f"truncated header: the file has {size} bytes, the header needs {_HEADER.size}")
    major, minor = struct.unpack_from("<HH", data, 8)
    ours = "%d.%d" % FORMAT_VERSION
    if major > FORMAT_VERSION[0]:
        fail(f"format version {major}.{minor} is newer than this tftpu reads ({ours}); "
             f"update tftpu or compile the model again")
    if major < 1:
        fail(f"unknown format version {major}.{minor} (this tftpu reads {ours})")
    if size < _HEADER.size:
        fail(f"truncated header: the file has {size} bytes, the header needs {_HEADER.size}")
    (_, _, _, count, header_len, align, table_crc, sha, header_crc) = _HEADER.unpack_from(data)
    if zlib.crc32(data[:_CRC_AT]) != header_crc:
        fail(f"header checksum mismatch (bytes 0..{_HEADER.size} are corrupt)")
    # The header is sound from here on: what follows catches files written wrongly, not bit rot.
    if header_len < _HEADER.size or header_len > MAX_HEADER or (
            (major, minor) <= FORMAT_VERSION and header_len != _HEADER.size):
        fail(f"malformed header: header length {header_len} in a version {major}.{minor} file")
    if count > MAX_SECTIONS:
        fail(f"malformed header: {count} sections, more than the {MAX_SECTIONS} a file may hold")
    if align < 1 or align > 1 << 20 or align & (align - 1):
        fail(f"malformed header: alignment {align} is not a power of two up to 2**20")
    table_end = header_len + _ENTRY.size * count
    if header_len > size:
        fail(f"truncated header: the file has {size} bytes, the header needs {header_len}")
    if table_end > size:
        fail(f"truncated: the section table ({count} sections) needs bytes {header_len}..{table_end}, "
             f"the file has {size}")
    if zlib.crc32(data[header_len:table_end]) != table_crc:
        fail(f"section table checksum mismatch (bytes {header_len}..{table_end} are corrupt)")

    entries, names, end = [], set(), table_end
    for i in range(count):
        raw, offset, length, crc = _ENTRY.unpack_from(data, header_len + _ENTRY.size * i)
        name = raw.rstrip(b"\0")
        if not _NAME_BYTES.fullmatch(name):
            fail(f"malformed section table: entry {i} has name {raw!r}, not 1 to 16 characters of [a-z0-9_]")
        name = name.decode("ascii")
        if name in names:
            fail(f"malformed section table: section {name!r} appears twice")
        names.add(name)
        expected = _align(end, align)
        if offset < end:
            fail(f"malformed section table: section {name!r} at offset {offset} overlaps what comes "
                 f"before it (which ends at {end})")
        if offset != expected:
            fail(f"malformed section table: section {name!r} at offset {offset}, expected {expected} "
                 f"(the end of what comes before it, {end}, rounded up to {align})")
        if offset + length > size:
            fail(f"truncated: section {name!r} needs bytes {offset}..{offset + length}, the file has {size}")
        entries.append((name, offset, length, crc))
        end = offset + length
    if size > end:
        fail(f"trailing garbage: {size - end} bytes after the end of the last section (byte {end})")

    start = table_end
    for name, offset, length, crc in entries:
        if any(data[start:offset]):
            fail(f"corrupt padding before section {name!r} (bytes {start}..{offset} are not zero)")
        if zlib.crc32(data[offset:offset + length]) != crc:
            fail(f"checksum mismatch in section {name!r} (bytes {offset}..{offset + length})")
        start = offset + length
    if hashlib.sha256(data[_HEADER.size:]).digest() != sha:
        fail("checksum mismatch: the file's SHA-256 differs from the one in its header")
    return entries


def parse_model_bytes(data: bytes, where: str = "<bytes>") -> dict[str, bytes]:
    """The sections of a `.tpumodel` held in `data`, in file order; errors name `where`."""
    view = memoryview(data).cast("B")
    return {name: bytes(view[off:off + n]) for name, off, n, _ in _entries(view, where)}


def _read(path) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise ModelFileError(path, "no such file") from None
    except IsADirectoryError:
        raise ModelFileError(path, "is a directory, not a tpumodel file") from None
    except (OSError, MemoryError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        raise ModelFileError(path, f"cannot read: {reason}") from None


def read_model_file(path) -> dict[str, bytes]:
    """The sections of the `.tpumodel` file `path`, in file order. Anything wrong with the file
    is one ModelFileError naming it and what is wrong."""
    return parse_model_bytes(_read(path), str(path))


def describe(path) -> list[dict]:
    """Name, offset, length and CRC-32 of each section of `path`, in file order (after the same
    checks as `read_model_file`)."""
    return [{"name": name, "offset": off, "length": n, "crc32": crc}
            for name, off, n, crc in _entries(_read(path), str(path))]
