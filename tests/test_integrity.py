"""rlx.store.integrity: what a stage wrote, recorded by size and hash, and each way a file can stop matching."""

from __future__ import annotations

from rlx.store.integrity import HASH, first_changed, folder_records


def written(tmp_path):
    (tmp_path / "policy").mkdir()
    files = [tmp_path / "policy" / "model.safetensors", tmp_path / "state.pt"]
    for number, file in enumerate(files):
        file.write_bytes(bytes(range(256)) * (number + 1))
    return files, folder_records(files, tmp_path)


def test_files_as_written_pass_and_each_change_is_named(tmp_path):
    files, records = written(tmp_path)
    assert set(records) == {"policy/model.safetensors", "state.pt"} and all(HASH in r for r in records.values())
    assert first_changed(tmp_path, records) is None
    data = bytearray(files[1].read_bytes())
    data[100] ^= 1  # same size, one bit
    files[1].write_bytes(bytes(data))
    assert first_changed(tmp_path, records) == f"{files[1]}: contents differ from what was written (corrupted)"
    assert first_changed(tmp_path, records, hashed=False) is None  # sizes only: a resume's quick look
    files[1].write_bytes(bytes(data[:10]))
    assert first_changed(tmp_path, records, hashed=False) == f"{files[1]}: 10 bytes, 512 when written (truncated?)"
    files[0].unlink()
    assert first_changed(tmp_path, records) == f"{files[0]}: missing"


def test_a_record_without_a_hash_is_checked_by_size(tmp_path):
    """Runs recorded before hashes were kept for checkpoints: their sizes still count."""
    files, records = written(tmp_path)
    sizes = {name: {"size": record["size"]} for name, record in records.items()}
    files[0].write_bytes(b"x" * files[0].stat().st_size)
    assert first_changed(tmp_path, sizes) is None
    files[0].write_bytes(b"x")
    assert first_changed(tmp_path, sizes).endswith("1 bytes, 256 when written (truncated?)")
