"""`mirrorkit bench --input-only` on a small real JPEG folder (no timing assertions), bad input."""

from __future__ import annotations

import importlib.util
import json

import pytest
from click.testing import CliRunner
from conftest import REPO

from mirrorkit.bench.input_only import InputBenchConfig
from mirrorkit.cli import cli


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("make_jpeg_folder",
                                                  REPO / "tools" / "make_jpeg_folder.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    root = tmp_path_factory.mktemp("photos")
    module.write_folder(root, images=20, classes=2, min_side=64, max_side=128)
    return root


@pytest.mark.fast
def test_config_refuses_data_that_is_not_encoded_images():
    with pytest.raises(ValueError, match="must be folder:PATH or files:GLOB"):
        InputBenchConfig(dataset="synthetic")
    with pytest.raises(ValueError, match="Valid: none, flip-shift, crop"):
        InputBenchConfig(dataset="folder:x", augment="zoom")
    assert InputBenchConfig(dataset="folder:x", augment="flip-shift").data_augment == "none"


def test_input_only_prints_every_rate_and_the_ratios(photos, tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, [
        "bench", "--input-only", "--dataset", f"folder:{photos}", "--image-size", "32",
        "--batch", "4", "--steps", "2", "--warmup-steps", "1", "--rounds", "2",
        "--augment", "crop", "--output", str(out)])
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    for arm in ("pipeline", "plain", "decode", "whole", "tutorial"):
        assert arm in lines, result.stdout
    assert "decode_and_crop_jpeg" in lines["decode"]
    assert "decode_jpeg of the whole image" in lines["whole"]
    report = json.loads((out / "input_bench.json").read_text())
    assert set(report["arms"]) == {"pipeline", "plain", "decode", "whole", "tutorial"}
    for arm in report["arms"].values():
        assert len(arm["rounds"]) == 2 and arm["images_per_sec"] > 0
        assert arm["images_per_cpu_sec"] > 0 and arm["rounds"][0]["images"] == 8
    assert report["ratios"]["pipeline_to_decode"] > 0
    assert report["ratios"]["pipeline_to_whole_per_cpu_second"] > 0
    assert report["ratios"]["tutorial_to_plain_per_cpu_second"] > 0
    assert report["config"]["augment"] == "crop" and report["cores"] >= 1


@pytest.mark.parametrize("args, message", [
    (["--dataset", "digits"], "must be folder:PATH or files:GLOB. Received: dataset='digits'"),
    (["--dataset", "folder:/no/such/folder"], "Image folder not found: /no/such/folder"),
    (["--dataset", "folder:x", "--workers", "2"], "no model: drop --workers"),
])
def test_bad_input_is_one_line(args, message):
    result = CliRunner().invoke(cli, ["bench", "--input-only", *args])
    assert result.exit_code != 0
    assert message in result.output
    assert "Traceback" not in result.output
    assert len([line for line in result.output.splitlines() if line.startswith("Error")]) == 1
