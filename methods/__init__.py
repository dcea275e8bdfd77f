"""Built-in ltbench methods.

Each module registers one method with ``@METHODS.register``. The package is loaded through the
``ltbench.methods`` entry point (see pyproject.toml), the same way a third-party plugin is, and
every public module in it is imported, so adding a method is adding one file here.
"""
