"""The methods of the foundation track: LIFT (``lift``) and zero-shot classification (``zero_shot``). Each module
registers one; the package is loaded through the ``ltbench.methods`` entry point, as the built-in methods/ are."""
