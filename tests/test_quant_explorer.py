"""The quantization explorer draws a figure with data and a report for every option of every control."""

import itertools

import pytest

from course_lib.compression.explore import BITS, GROUPS, OUTLIERS, draw_quant_error, quant_explorer


@pytest.mark.parametrize("bits,group", list(itertools.product(BITS, GROUPS)))
def test_every_option_draws(bits, group):
    for symmetric, outlier in itertools.product((True, False), OUTLIERS):
        fig, text = draw_quant_error(bits, group, symmetric, outlier)
        axes = fig.get_axes()
        assert len(axes) == 2 and axes[0].patches and axes[1].lines
        assert "bytes/weight" in text and "rms error" in text


def test_outlier_hurts_a_shared_scale():
    def err(text):
        return float(text.split("= ")[-1].split("%")[0])

    _, calm = draw_quant_error(4, "tensor", True, 1.0)
    _, loud = draw_quant_error(4, "tensor", True, 100.0)
    _, grouped = draw_quant_error(4, 32, True, 100.0)
    assert err(loud) > 2 * err(calm) and err(grouped) < err(loud) / 5
    with pytest.raises(ValueError, match="outlier"):
        draw_quant_error(outlier=0.5)


def test_widget_builds_and_redraws():
    box = quant_explorer()
    out = box.children[-1]
    assert len(out.outputs) == 2
    box.children[0].value = 8
    assert "int8" in out.outputs[0]["text"]
