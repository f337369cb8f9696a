"""wispsim's tests, one folder per layer of the package (docs/architecture.md).

A test file lives in the folder of the code it mainly tests; ``house/`` holds the checks of the
whole house (layers, docs, notebooks, hostile inputs). Shared helpers are imported as
``from tests.support import ...`` from any folder; ``conftest.py`` applies to every folder.
"""
