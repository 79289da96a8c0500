"""A failing value never prints as its bound in report.md (prodip.conformance.report).

python -m pytest tests/conformance/test_report_digits.py -q
"""

from __future__ import annotations

from prodip.conformance.report import _cell, _failed_lines, _fmt_failed


def test_a_failing_top1_just_under_its_bound_shows_the_digits_that_differ():
    top1 = {"metric": "top1", "value": 0.94996, "tolerance": {"min": 0.95}, "passed": False}
    # "`top1` = 0.95 (tolerance {'min': 0.95})" and "95.00%" read as passing
    assert _failed_lines("int8", [top1]) == ["- **int8** `top1` = 0.94996 (tolerance {'min': 0.95})"]
    assert _cell({"top1": 0.94996}, "top1", "{:.2%}", "top-1", [top1]) == "94.996%"
    # a passing value, or a failing one already distinct from its bound, keeps the column's digits
    assert _cell({"top1": 0.94996}, "top1", "{:.2%}", "top-1", [{**top1, "passed": True}]) == "95.00%"
    assert _cell({"top1": 0.9}, "top1", "{:.2%}", "top-1", [{**top1, "value": 0.9}]) == "90.00%"


def test_known_answers_for_max_and_equals_bounds():
    assert _fmt_failed(1.00004e-4, "{:.1e}", {"max": 1e-4}) == "1.00004e-04"
    assert _fmt_failed(2e-4, "{:.1e}", {"max": 1e-4}) == "2.0e-04"
    assert _fmt_failed(0.9999999, "{:.3g}", {"equals": 1}) == "0.9999999"
    assert _fmt_failed(float("nan"), "{:.3g}", {"min": 0.95}) == "nan"
    assert _fmt_failed(True, "{:.3g}", {"equals": True}) == "yes"
