"""Makes ``pytest conformance/ --export-dir DIR --checkpoint CKPT`` work: registers the plugin.

Registration (rather than re-exporting the hooks) lets ``-p prodip.conformance.pytest_plugin`` and this
conftest coexist without registering the options twice.

    pytest conformance/ --export-dir runs/demo/export --checkpoint runs/demo/train
"""

import importlib

PLUGIN = "prodip.conformance.pytest_plugin"


def pytest_addoption(parser, pluginmanager):
    if not pluginmanager.has_plugin(PLUGIN):
        # pytest_addoption is a historic hook: the plugin's own one runs on registration.
        pluginmanager.register(importlib.import_module(PLUGIN), PLUGIN)
