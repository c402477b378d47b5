"""The charts' geometry over plain numbers: values scaled to SVG coordinates."""

from web.core.chart_geometry import Frame, bars, candle_shapes, linear, padded, slots, ticks

FRAME = Frame(width=200, height=120, left=20, right=0, top=10, bottom=10)


def test_a_scale_maps_its_ends_and_puts_a_single_value_in_the_middle():
    y = linear(100, 200, 110, 10)  # y grows downwards

    assert (y(100), y(150), y(200)) == (110, 60, 10)
    assert linear(5, 5, 110, 10)(5) == 60


def test_bounds_leave_a_tenth_spare_and_a_least_span_and_never_go_below_the_floor():
    assert padded([1_000, 2_000], least_span=10) == (900, 2_100)
    assert padded([2_000_000], least_span=100_000) == (1_940_000, 2_060_000)
    assert padded([0, 1_000], least_span=10) == (0, 1_100)


def test_ticks_are_rounded_to_their_step():
    assert ticks(1_940_000, 2_060_000, step=10_000) == [1_940_000, 1_970_000, 2_000_000,
                                                        2_030_000, 2_060_000]
    assert ticks(0, 1, step=1) == [0, 1]


def test_slots_split_the_plot_evenly():
    centres, width = slots(4, FRAME)

    assert width == 45 and centres == [42.5, 87.5, 132.5, 177.5]


def test_a_candle_body_spans_open_to_close_and_its_wick_high_to_low():
    y = linear(0, 100, 110, 10)

    [(index, rising), (later, falling)] = candle_shapes(
        [(20, 90, 10, 80), None, (80, 80, 30, 30)], FRAME, y)

    assert (index, later) == (0, 2)  # the empty interval draws nothing
    assert rising.rising and not falling.rising
    assert (rising.wick_top, rising.wick_bottom) == (y(90), y(10))
    assert (rising.body_top, rising.body_height) == (y(80), round(y(20) - y(80), 1))
    assert falling.body_top == y(80)


def test_a_flat_candle_keeps_a_visible_body():
    [(_, flat)] = candle_shapes([(50, 50, 50, 50)], FRAME, linear(0, 100, 110, 10))

    assert flat.body_height == 1.0


def test_bars_reach_the_top_at_the_largest_value_and_a_zero_has_no_height():
    tall, empty, half = bars([8, 0, 4], FRAME, top=10, bottom=110)

    assert (tall.y, tall.height) == (10, 100)
    assert empty.height == 0
    assert (half.y, half.height) == (60, 50)
