"""The pipeline picture: simulated 1F1B and interleaved steps are drawn to a PNG of the expected
size with one coloured band per stage, and a path in a missing folder fails before anything is
written."""

import matplotlib.image
import numpy as np
import pytest

from ringzero.plan.pipeline import schedule as pipeline
from ringzero.twin.pipeline_plot import plot


def _timeline(pp, m, schedule, v=1):
    # simulate() costs are unit-free; read them as 10 ms so the axis shows realistic numbers.
    return [[{"kind": a.kind, "micro": a.micro, "chunk": a.chunk, "start": 0.01 * s, "end": 0.01 * e}
             for a, s, e in stage] for stage in pipeline.simulate(pp, m, schedule, v)]


def _coloured_bands(img):
    """Runs of image rows holding saturated (non-grey) pixels: the stages' bars, top to bottom."""
    rgb = img[..., :3]
    saturated = (rgb.max(axis=-1) - rgb.min(axis=-1)) > 0.15
    rows = saturated.sum(axis=1) > 20
    edges = np.flatnonzero(np.diff(np.r_[0, rows.astype(int), 0]))
    return list(zip(edges[::2], edges[1::2]))


@pytest.mark.parametrize("pp,m,schedule,v", [(4, 8, "1f1b", 1), (2, 4, "interleaved", 2)])
def test_plot_writes_png_with_one_band_per_stage(tmp_path, pp, m, schedule, v):
    timeline = _timeline(pp, m, schedule, v)
    bubble = pipeline.idle_fraction(pipeline.simulate(pp, m, schedule, v))
    path = tmp_path / f"{schedule}.png"
    plot(timeline, str(path), title=f"{schedule} p={pp} m={m} v={v}", bubble=bubble,
         predicted=pipeline.bubble_fraction(pp, m, schedule, v))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    img = matplotlib.image.imread(str(path))
    assert img.shape[:2] == (round((1.6 + 0.45 * pp) * 120), 1200)
    assert len(_coloured_bands(img)) == pp
    assert [p.name for p in tmp_path.iterdir()] == [path.name]     # no temporary file left


def test_plot_into_missing_folder_raises_and_writes_nothing(tmp_path):
    missing = tmp_path / "no_such_dir" / "step.png"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        plot(_timeline(2, 2, "1f1b"), str(missing))
    assert list(tmp_path.iterdir()) == []


def test_plot_rejects_empty_and_malformed_timelines(tmp_path):
    with pytest.raises(ValueError, match="no events"):
        plot([[], []], str(tmp_path / "x.png"))
    bad = [[{"kind": "W", "micro": 0, "chunk": 0, "start": 0.0, "end": 1.0}]]
    with pytest.raises(ValueError, match="'F' or 'B'"):
        plot(bad, str(tmp_path / "x.png"))
    assert list(tmp_path.iterdir()) == []
