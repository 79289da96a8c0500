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


def test_a_failing_bpc_delta_names_each_language_over_the_bound_with_its_two_parts():
    check = {"metric": "bpc_delta_max", "value": 0.0118, "tolerance": {"max": 0.01}, "passed": False}
    heldout = {
        "bn": {
            "bpc_delta": -0.0118,
            "bpc_delta_kl": 0.0005,
            "bpc_delta_text": -0.0123,
            "bpc_delta_text_sd": 0.00175,
            "bpc_ref": 8.87,
            "entropy_bpc_ref": 3.64,
        },  # fmt: skip
        "en": {
            "bpc_delta": 0.0001,
            "bpc_delta_kl": 0.0001,
            "bpc_delta_text": 0.0,
            "bpc_delta_text_sd": 0.001,
            "bpc_ref": 2.98,
            "entropy_bpc_ref": 2.9,
        },  # fmt: skip
    }
    lines = _failed_lines("int8", [check], {"heldout": heldout})
    assert len(lines) == 2 and lines[0].startswith("- **int8** `bpc_delta_max` = 0.0118")
    assert lines[1].startswith("  - bn: Δbpc -0.0118 = KL part +0.0005 (")
    assert "+ text part -0.0123 (7 sd of its spread" in lines[1]
    assert "8.87 bits/char on this text vs its own entropy 3.64" in lines[1]
    # a text part well inside its spread says so with its digits (not "0 sd"), and a zero spread is named
    small = {**heldout["bn"], "bpc_delta_text": -0.0008}
    assert "(0.46 sd of its spread" in _failed_lines("int8", [check], {"heldout": {"bn": small}})[1]
    flat = {**heldout["bn"], "bpc_delta_text_sd": 0.0}
    assert "(its spread is 0 on such text)" in _failed_lines("int8", [check], {"heldout": {"bn": flat}})[1]
    # a report written before the split (no parts) keeps its one line
    assert _failed_lines("int8", [check], {"heldout": {"bn": {"bpc_delta": -0.0118}}}) == lines[:1]
