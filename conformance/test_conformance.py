"""The conformance checks as pytest tests (collected only with ``pytest conformance/``).

pytest conformance/ --export-dir runs/demo/export --checkpoint runs/demo/train -q
"""

from __future__ import annotations

from prodip.conformance.checks import find_check


def test_check(conformance_check, conformance_report):
    """One gated metric of one candidate is within its tolerance (``export::*`` = export-wide)."""

    candidate, metric = conformance_check
    check = find_check(conformance_report, candidate, metric)
    errors = {} if candidate == "export" else conformance_report["candidates"][candidate]["errors"]
    assert check["passed"] is not False, (
        f"{candidate} {metric} = {check['value']!r} outside tolerance {check['tolerance']!r}"
        + (f"; errors: {errors}" if errors else "")
    )
