"""Makes ``pytest conformance/ --export-dir DIR --checkpoint CKPT`` work: the plugin's hooks.

    pytest conformance/ --export-dir runs/demo/export --checkpoint runs/demo/train
"""
from conformance.pytest_plugin import conformance_report, pytest_addoption, pytest_generate_tests  # noqa: F401
