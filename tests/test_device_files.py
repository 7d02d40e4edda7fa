"""What comes back from the GPU machine's $OUT (benchmarks/device_files.py): the check fails on every layout that
breaks a limit and passes one that keeps to them; publishing lays stage files out within the limits."""

from __future__ import annotations

import os
import tarfile

import pytest

from benchmarks.device_files import MAX_FILE_BYTES, MAX_FILES, StageFiles, layout_problems, main, place, publish


def write(path, size: int = 10):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)  # sparse: a 17 MiB file costs nothing
    return path


def test_a_layout_within_the_limits_passes(tmp_path, capsys):
    for name in ("session.txt", "quick/log.txt", "quick/training_gpu.csv", "depth/depth-runs-1.tar.gz"):
        write(tmp_path / name, 1000)
    write(tmp_path / "a" / "b" / "deepest_allowed.txt")
    assert layout_problems(tmp_path) == []
    assert main(["check", str(tmp_path)]) == 0 and "fits" in capsys.readouterr().out


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda out: [write(out / "s" / f"f{i}.txt") for i in range(MAX_FILES + 1)], "9 files (at most 8)"),
        (lambda out: write(out / "a" / "b" / "c" / "f.txt"), "3 folders down"),
        (lambda out: write(out / "s" / "big.tar.gz", MAX_FILE_BYTES + 1), "(at most 16 MiB a file)"),
        (lambda out: [write(out / f"s{i}" / "f.bin", 15 * 2**20) for i in range(5)], "MiB in all (at most 64 MiB)"),
        (lambda out: write(out / "s" / "log (1).txt"), "a name with characters"),
        (lambda out: write(out / "bad dir" / "f.txt"), "bad dir: a name"),
        (lambda out: (write(out / "s" / "f.txt"), os.symlink(out / "s" / "f.txt", out / "s" / "link.txt")), "a link"),
    ],
    ids=["nine-files", "too-deep", "file-too-big", "total-too-big", "bad-file-name", "bad-folder-name", "link"],
)
def test_each_broken_limit_is_found(tmp_path, capsys, make, says):
    make(tmp_path)
    problems = layout_problems(tmp_path)
    assert any(says in p for p in problems), problems
    assert main(["check", str(tmp_path)]) == 1 and "does not fit" in capsys.readouterr().out


def stage(tmp_path, name: str, n: int, size: int = 100) -> StageFiles:
    return StageFiles(name, [(f"{name}{i}.txt", write(tmp_path / "src" / name / f"{i}.txt", size)) for i in range(n)])


def test_files_that_fit_stay_flat_and_more_are_packed_least_important_first(tmp_path):
    few = [stage(tmp_path, "quick", 4), stage(tmp_path, "check", 2)]
    assert publish(few, tmp_path / "out1", MAX_FILES - 1) == []
    assert sorted(p.name for p in (tmp_path / "out1").rglob("*") if p.is_file()) == sorted(
        n for s in few for n, _ in s.files
    )
    many = [stage(tmp_path, "placements", 2), stage(tmp_path, "profile", 7)]
    notes = publish(many, tmp_path / "out2", MAX_FILES - 1)
    out = tmp_path / "out2"
    assert layout_problems(out) == [] and len([p for p in out.rglob("*") if p.is_file()]) == MAX_FILES - 1
    assert sorted(p.name for p in (out / "placements").iterdir()) == ["placements0.txt", "placements1.txt"]
    kept = sorted(p.name for p in (out / "profile").iterdir())
    assert kept == ["profile-files.tar.gz", "profile0.txt", "profile1.txt", "profile2.txt", "profile3.txt"]
    with tarfile.open(out / "profile" / "profile-files.tar.gz") as tar:  # the least important, in their order
        assert tar.getnames() == ["profile4.txt", "profile5.txt", "profile6.txt"]
    assert notes == [
        "profile: profile4.txt, profile5.txt, profile6.txt packed into profile-files.tar.gz "
        "(more files than the 8 that come back)"
    ]


def test_the_stage_using_most_slots_gives_way_and_every_stage_keeps_a_file(tmp_path):
    placement = place([stage(tmp_path, f"s{i}", n) for i, n in enumerate([1, 3, 3, 2, 1, 1])], max_files=7)
    slots = {k: len(v) + (k in placement.packed) for k, v in placement.flat.items()}
    assert sum(slots.values()) <= 7 and all(n >= 1 for n in slots.values())
    assert slots["s0"] == 1 and not placement.packed.get("s0")  # a one-file stage is never packed
    with pytest.raises(ValueError, match="at most 7 can come back"):
        place([stage(tmp_path, f"t{i}", 1) for i in range(8)], max_files=7)


def test_a_file_over_the_size_limit_is_left_out_with_a_note(tmp_path):
    big = StageFiles(
        "profile",
        [
            ("log.txt", write(tmp_path / "log.txt")),
            ("trace.json.gz", write(tmp_path / "trace.json.gz", MAX_FILE_BYTES + 1)),
        ],
    )
    notes = publish([big], tmp_path / "out")
    assert notes == ["left out: profile/trace.json.gz (16.0 MiB: over 16 MiB)"]
    assert [p.name for p in (tmp_path / "out" / "profile").iterdir()] == ["log.txt"]
