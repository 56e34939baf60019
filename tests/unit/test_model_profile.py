"""An LLM's token profile in the model repository (`bridge.models.profile`): written per
version and read back, the newest version's used, a bad file refused by name and field
(and the model then sized without a profile), a changed file read again."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bridge.models.profile import (
    PROFILE_FILE,
    ProfileError,
    Profiles,
    newest,
    read_profiles,
    write_profile,
)
from bridge.policy.tokens import SMOL_LAB, TokenProfile


def model(root: Path, name: str = "smol", versions: tuple[str, ...] = ("1", "2")) -> Path:
    d = root / name
    for v in versions:
        (d / v).mkdir(parents=True)
    (d / "config.pbtxt").write_text(f'name: "{name}"\n')
    return d


def test_a_profile_per_version_written_and_read_back(tmp_path: Path) -> None:
    d = model(tmp_path)
    write_profile(d, "1", SMOL_LAB, points=24)
    slower = TokenProfile(2, 0.005, 0.12, (0.018, 0.025))
    write_profile(d, "2", slower, points=30)
    got = read_profiles(d)
    assert set(got) == {"1", "2"}
    assert got["1"].profile == SMOL_LAB and got["1"].points == 24
    best = newest(got)
    assert best is not None and best.version == "2" and best.profile == slower
    assert best.measured_at  # stamped
    # the first version's entry is kept when the second is written
    assert json.loads((d / PROFILE_FILE).read_text())["versions"]["1"]["sequences"] == 2


def test_writing_refuses_what_is_no_model_or_no_version(tmp_path: Path) -> None:
    d = model(tmp_path)
    with pytest.raises(ProfileError, match="no version '7'"):
        write_profile(d, "7", SMOL_LAB, points=1)
    with pytest.raises(ProfileError, match="not a model folder"):
        write_profile(tmp_path / "nothing", "1", SMOL_LAB, points=1)
    assert not (d / PROFILE_FILE).exists()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "not JSON"),
        ('{"model": "smol"}', "no 'versions' object"),
        ('{"versions": {"x": {}}}', "'x' is not a version number"),
        ('{"versions": {"1": {"sequences": 2}}}', "missing prefill_s_per_token"),
        (
            '{"versions": {"1": {"sequences": 2, "prefill_s_per_token": 0.004, '
            '"prefill_overhead_s": 0.1, "tpot_s": [0.02], "prefix_hit": 0}}}',
            "tpot_s needs one entry per sequence",
        ),
    ],
)
def test_a_bad_file_is_refused_by_name_and_field(tmp_path: Path, text: str, says: str) -> None:
    d = model(tmp_path)
    (d / PROFILE_FILE).write_text(text)
    with pytest.raises(ProfileError, match=says):
        read_profiles(d)
    profiles = Profiles(tmp_path)
    assert profiles.read(["smol"]) == {}  # sized without a profile
    assert says in profiles.problems["smol"] and str(d / PROFILE_FILE) in profiles.problems["smol"]


def test_the_reader_parses_a_file_again_only_when_it_changed(tmp_path: Path) -> None:
    d = model(tmp_path)
    profiles = Profiles(tmp_path)
    assert profiles.read(["smol", "other"]) == {}
    write_profile(d, "1", SMOL_LAB, points=24)
    assert profiles.read(["smol"]) == {"smol": SMOL_LAB}
    (d / PROFILE_FILE).write_text("{not json")
    st = (d / PROFILE_FILE).stat()
    os.utime(d / PROFILE_FILE, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert profiles.read(["smol"]) == {} and "not JSON" in profiles.problems["smol"]
    (d / PROFILE_FILE).unlink()
    assert profiles.read(["smol"]) == {} and profiles.problems == {}
