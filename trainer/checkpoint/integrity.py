"""Is a checkpoint whole? The zip archive's CRCs, checked before a file is resumed or loaded."""

from __future__ import annotations

import mmap
import os
import struct
import zipfile
import zlib

from trainer.checkpoint.files import CheckpointError

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, then the name's and the extra field's lengths
_LOCAL_SIGNATURE = b"PK\x03\x04"


def damage(path: str | os.PathLike) -> str | None:
    """What is wrong with the zip archive at ``path`` (a checkpoint file torch.save wrote), or
    None if every entry's bytes match the CRC-32 the archive recorded for them.

    torch.load does not check the CRCs, so a flipped bit inside a tensor loads silently. This
    reads the whole file once, through a memory map (no copy; zlib's crc32 runs outside the
    GIL): about what reading the file costs (benchmarks/checkpoint_verify_cost.py).
    """
    try:
        with open(path, "rb") as f, zipfile.ZipFile(f) as archive:
            entries = archive.infolist()
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return "the file is empty"
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                for entry in entries:
                    problem = _entry_damage(archive, entry, data, size)
                    if problem is not None:
                        return problem
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, zlib.error) as err:
        return f"its zip structure is broken ({err})"
    return None


def _entry_damage(archive: zipfile.ZipFile, entry: zipfile.ZipInfo, data: mmap.mmap, size: int) -> str | None:
    if entry.compress_type != zipfile.ZIP_STORED:  # torch.save stores; anything else through zipfile
        with archive.open(entry) as member:
            while member.read(1 << 20):  # raises BadZipFile on a CRC mismatch
                pass
        return None
    start = entry.header_offset
    if start + _LOCAL_HEADER.size > size:
        return f"entry {entry.filename!r} lies past the end of the file"
    signature, name_len, extra_len = _LOCAL_HEADER.unpack_from(data, start)
    if signature != _LOCAL_SIGNATURE:
        return f"entry {entry.filename!r} has no local header where the archive's directory says"
    begin = start + _LOCAL_HEADER.size + name_len + extra_len
    end = begin + entry.compress_size
    if end > size:
        return f"entry {entry.filename!r} lies past the end of the file"
    with memoryview(data)[begin:end] as view:
        crc = zlib.crc32(view)
    if crc != entry.CRC:
        return f"the bytes of entry {entry.filename!r} do not match its CRC-32 (stored {entry.CRC:#010x}, read {crc:#010x})"
    return None


def verify(path: str | os.PathLike, label: str | None = None) -> None:
    """Raise a CheckpointError naming ``path`` if its bytes are damaged (see :func:`damage`)."""
    problem = damage(path)
    if problem is not None:
        raise CheckpointError(
            f"{label or repr(os.fspath(path))} is damaged: {problem}. Its contents changed after it was written "
            "(a disk or copy error), so it is not loaded. Use another checkpoint (ckpt_path='last' falls back to "
            "the newest intact one), or a backup of this file."
        )
