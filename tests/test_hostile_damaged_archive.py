"""A bundle archive damaged after its first members is refused, not diagnosed from the part
before the damage (issue #37).

tarfile takes the first block that is not a valid header for the end of the archive, and
never reads the gzip trailer that holds the CRC; a `.tar.gz` made of two gzip members (as
pigz or `cat a.gz b.gz` make) whose second member is damaged was read as the first half.
"""

from __future__ import annotations

import gzip
import io
import tarfile
import zlib

from tests.hostile_corpus import FIXTURE, run


def _tar_bytes() -> tuple[bytes, int]:
    """The fixture bundle as an uncompressed tar, meta.json first, and the offset of a
    member header about 80% of the way in."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        tar.add(FIXTURE / "meta.json", "meta.json")
        for path in sorted(FIXTURE.rglob("*")):
            if path.name != "meta.json" or path.parent != FIXTURE:
                tar.add(path, str(path.relative_to(FIXTURE)), recursive=False)
    data = buffer.getvalue()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        offsets = [member.offset for member in tar.getmembers() if member.isfile()]
    return data, offsets[len(offsets) * 4 // 5]


def _two_members(data: bytes, split: int) -> bytes:
    # The second member stored, not deflated: a damaged byte there decompresses as
    # a damaged byte, not as a zlib error.
    return gzip.compress(data[:split]) + gzip.compress(data[split:], compresslevel=0)


def test_the_undamaged_two_member_archive_is_diagnosed(tmp_path):
    data, split = _tar_bytes()
    archive = tmp_path / "whole.tar.gz"
    archive.write_bytes(_two_members(data, split))
    result = run(["diagnose", "--bundle", str(archive), "--json"], timeout=120)
    assert result.returncode in (0, 1, 2), result.stderr[-2000:]


def _refused(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 3, (result.returncode, result.stdout[:300], result.stderr[-2000:])
    assert len(lines) == 1 and "Traceback" not in result.stderr, lines
    return lines[0]


def test_a_damaged_header_in_a_later_gzip_member_is_refused(tmp_path):
    data, split = _tar_bytes()
    packed = bytearray(_two_members(data, split))
    second = len(gzip.compress(data[:split]))
    packed[second + 10 + 5 + 3] ^= 0x20  # gzip header, stored-block header, a name byte
    archive = tmp_path / "damaged-header.tar.gz"
    archive.write_bytes(bytes(packed))
    for argv in (["diagnose", "--bundle", str(archive)], ["bundle", "show", str(archive)]):
        assert "damaged" in _refused(run(argv, timeout=120))


def test_a_crc_mismatch_is_refused(tmp_path):
    """The data inflates cleanly but is not what was compressed (the trailer's CRC-32)."""
    data, _ = _tar_bytes()
    packed = bytearray(gzip.compress(data))
    packed[-8:-4] = (zlib.crc32(data) ^ 1).to_bytes(4, "little")
    archive = tmp_path / "bad-crc.tar.gz"
    archive.write_bytes(bytes(packed))
    assert "CRC" in _refused(run(["diagnose", "--bundle", str(archive)], timeout=120))
